"""The probe budget: what a study has spent, what the next probe will cost, the best feasible value so far.

Spend lives in the trials' user attrs (``probe_yuan``), so ``--resume`` and other workers see it. A running
probe's claim on the budget lives there too: the estimate it was admitted with (``reserved_yuan``) and, once it
runs past that, its spend so far (``running_yuan``). Earlier probes come first: a probe counts an earlier running
probe at the larger of the two, a later one at its estimate only, so when two run past their estimates the later
one is stopped first, and together they never pass the budget (:func:`held`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tunekit.estimate import cost
from tunekit.estimate.profiles import PriceProfile
from tunekit.search.storage import spend_of
from tunekit.search.measure import trial_learning_key

CONFIRMED_ATTR = "confirmation_spent_yuan"
"""Study user attr: what every confirmation round of the study has spent (a resumed search confirms again)."""
KILL_GRACE_S = 5.0
"""Time the launcher may take to end a probe's tree after its timeout."""
RESERVED_ATTR = "reserved_yuan"
"""Trial user attr: the estimate a running probe was admitted with."""
RUNNING_ATTR = "running_yuan"
"""Trial user attr: a running probe's spend so far, written once it passes its estimate."""


def first_estimate(timeout_s: float, gpus: int, profile: PriceProfile) -> float:
    """The first probe's spend before anything was measured: its timeout (an upper bound) on its GPUs."""
    return cost.probe_spend(timeout_s + KILL_GRACE_S, gpus, profile).yuan


def _probed(trials: list[optuna.trial.FrozenTrial]) -> list[float]:
    return [t.user_attrs["probe_yuan"] for t in trials if t.user_attrs.get("probe_yuan", 0) > 0]


def estimate_next(trials: list[optuna.trial.FrozenTrial], first: float) -> float:
    """The median spend of the probes so far that ended ok, else of every probe so far, else the first probe's
    conservative estimate. A probe that crashed or was cut short (by its timeout, capped near the end of the budget)
    says little of a whole probe's length: counting it would lower the estimate each time one is cut short, and
    admit the next probe with a still shorter cap."""
    whole = _probed([t for t in trials if t.user_attrs.get("status") == "ok"])
    spends = whole or _probed(trials)
    return statistics.median(spends) if spends else first


def admitted_at(trials: list[optuna.trial.FrozenTrial], first: float, gpus: int, profile: PriceProfile) -> float:
    """What the budget must hold for the next trial's probe: :func:`estimate_next` with the kill grace, which its
    capped timeout leaves (the first probe's estimate, its timeout and the grace, holds it already)."""
    return estimate_next(trials, first) + (grace_yuan(gpus, profile) if _probed(trials) else 0.0)


def grace_yuan(gpus: int, profile: PriceProfile) -> float:
    """What the kill grace costs on ``gpus``: a probe admitted with the estimate alone would have its timeout capped
    that much below the time the estimate buys."""
    return cost.probe_spend(KILL_GRACE_S, gpus, profile).yuan


def held(trials: list[optuna.trial.FrozenTrial], *, by: int | None = None) -> float:
    """What the running probes hold of the budget as trial number ``by`` sees it (None: a trial yet to be admitted,
    later than all): an earlier probe its estimate or its spend so far, the larger; a later one its estimate."""
    def hold(t: optuna.trial.FrozenTrial) -> float:
        ua = t.user_attrs
        first = float(ua.get(RESERVED_ATTR, 0.0))
        return first if by is not None and t.number > by else max(first, float(ua.get(RUNNING_ATTR, 0.0)))

    return sum(hold(t) for t in trials if t.state == TrialState.RUNNING and t.number != by)


def probing(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Running trials admitted to run a probe (a trial waiting on a running twin holds no reservation)."""
    return sum(t.state == TrialState.RUNNING and RESERVED_ATTR in t.user_attrs for t in trials)


def spent(trials: list[optuna.trial.FrozenTrial], profile: PriceProfile) -> float:
    return sum(spend_of(t, profile) for t in trials)


def study_spent(study: optuna.Study, profile: PriceProfile) -> float:
    """Probe yuan of every trial and of every confirmation round of the study."""
    return spent(study.get_trials(deepcopy=False), profile) + float(study.user_attrs.get(CONFIRMED_ATTR, 0.0))


def _priced(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The ok probes with a finite projection."""
    return [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
            and t.user_attrs.get("status") == "ok"]


def best_feasible(trials: list[optuna.trial.FrozenTrial]) -> float | None:
    """The cheapest projection of a trial whose reward reaches the threshold (verdict ``feasible``, the rule of
    :mod:`tunekit.search.answer`); a reward within noise of it does not count."""
    return min((t.value for t in _priced(trials) if t.user_attrs.get("verdict") == "feasible"), default=None)


@dataclass(frozen=True)
class PruneBar:
    """What a running probe's cost is held against (:func:`prune_bar`): a finished trial's projected run."""

    yuan: float
    trial: int
    steps: int | None
    """The run length the probe is projected over before it reaches the threshold itself: the trial's own, where it
    shares the probe's learning (None: the probe's steps so far, plus one)."""

    def says(self) -> str:
        if self.steps is None:
            return f"the best feasible (trial {self.trial}, {self.yuan:.4g} yuan)"
        return (f"trial {self.trial}'s {self.yuan:.4g} yuan, whose learning it shares (a run of {self.steps} steps to "
                "the threshold)")


def prune_bar(trials: list[optuna.trial.FrozenTrial], key: str) -> PruneBar | None:
    """The cheapest of two bars for pruning a probe of learning ``key`` (:func:`tunekit.search.measure.learning_key`)
    on cost: the best feasible trial (:func:`best_feasible`'s rule), and a trial of the same learning whose reward
    reaches the threshold or is within noise of it. A probe of the same learning differs from that trial in systems
    knobs only: where their curves agree it is read with that trial's reward and run length (the learning twins of
    :mod:`tunekit.search.objective`), so only its cost per step can set it apart, and it is projected over that run
    length. A search whose threshold sits at the baseline's level reads every trial within noise, and would otherwise
    prune nothing. None: no bar yet."""
    ok = _priced(trials)
    bars = [PruneBar(t.value, t.number, int(t.user_attrs["projected_steps"])) for t in ok
            if t.user_attrs.get("projected_steps") is not None and trial_learning_key(t.user_attrs) == key
            and t.user_attrs.get("verdict") in ("feasible", "within noise")]
    bars += [PruneBar(t.value, t.number, None) for t in ok if t.user_attrs.get("verdict") == "feasible"]
    return min(bars, key=lambda b: b.yuan, default=None)  # a tie keeps the bar that lends its run length
