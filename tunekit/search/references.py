"""The references of a search (``search.references``): configurations the answer is priced against, each probed once,
when the time left allows it.

A reference may run another trainer at its own defaults, far slower than anything the space holds, so it is not
queued behind the baseline when the study is created: the study keeps the references (``ATTR``, in the recipe's
order), and the search enqueues one, under the study lock (:mod:`tunekit.search.lock`), at the moment it fits the time
left (``tunekit.search.run``); meanwhile the space's trials that fit run. A reference no trial has probed yet is
*waiting*: its probe is expected to take its timeout and the kill grace, and the budget keeps that much back for it,
priced on its devices (:class:`Waiting`). Once enqueued it is a trial like any other (a retry of a killed one
included), so no two workers probe it. A study whose references were enqueued at its creation (as WAITING trials)
keeps none here: its references run as Optuna hands them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

from tunekit.config import apply_overrides, validate
from tunekit.estimate import cost
from tunekit.search import space
from tunekit.search.budget import KILL_GRACE_S

if TYPE_CHECKING:
    from tunekit.search.setup import Setup

ATTR = "references"
"""Study user attr: each reference as ``{"name", "params", "sets"}`` (its values of the space's params, its overrides
beyond them), in the recipe's order."""


@dataclass(frozen=True)
class Waiting:
    """A reference no trial has probed yet, and the bound on its probe: its timeout and the kill grace (``seconds``),
    that long priced on its devices (``yuan``)."""

    name: str
    params: dict[str, Any]
    sets: list[str]
    seconds: float
    yuan: float


def keep(study: optuna.Study, setup: Setup) -> None:
    """Keep the recipe's references in the new ``study``, none enqueued."""
    s = setup.base.search
    refs = [(ref.name, *space.reference_trial(ref, setup.base_raw, s.space, setup.source)) for ref in s.references]
    study.set_user_attr(ATTR, [{"name": name, "params": params, "sets": rest} for name, params, rest in refs])


def unprobed(attrs: Mapping[str, Any], trials: Sequence[optuna.trial.FrozenTrial]) -> list[dict[str, Any]]:
    """The kept references (study user attrs ``attrs``) that no trial of ``trials`` probes, in the recipe's order."""
    taken = {t.user_attrs.get("reference") for t in trials}
    return [r for r in attrs.get(ATTR) or [] if r["name"] not in taken]


def waiting(study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial], setup: Setup) -> list[Waiting]:
    """:func:`unprobed`, each with the bound on its probe (its own recipe's timeout, on its own devices)."""
    out = []
    for r in unprobed(study.user_attrs, trials):
        recipe = validate(apply_overrides(setup.base_raw, space.overrides(r["params"]) + list(r["sets"])),
                          f"{setup.source}: search.references {r['name']}")
        seconds = recipe.probe.timeout_s + KILL_GRACE_S
        yuan = cost.probe_spend(seconds, recipe.system.world_size, setup.profile).yuan
        out.append(Waiting(r["name"], dict(r["params"]), list(r["sets"]), seconds, yuan))
    return out


def enqueue(study: optuna.Study, ref: Waiting) -> None:
    """Queue ``ref``'s trial (the caller holds the study lock, so no other worker queues it too)."""
    study.enqueue_trial(ref.params, user_attrs={"reference": ref.name, "reference_sets": ref.sets})


def named(refs: Sequence[Waiting]) -> str:
    """``the reference a`` / ``the references a, b``."""
    return f"the reference{'s' if len(refs) > 1 else ''} {', '.join(r.name for r in refs)}"
