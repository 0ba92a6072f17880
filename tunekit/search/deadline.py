"""The search's time limit (``tunekit search --time-limit``): no probe starts that is expected to end after it.

A trial's probe is expected to take as long as the longest probe of its runner the study has finished, trials and
confirmation probes alike, the references' aside, and a runner none ran as long as its timeout allows
(:func:`expected_probe_s`): before the sampler has chosen, as long as that of the quickest runner it may choose, and
once it has, a trial whose runner does not fit the time left is deferred (:class:`Deferred`: the search stops at its
limit and ``--resume`` probes that configuration first); a reference's first probe as long as its timeout allows (it
may run another trainer at its own defaults, slower than anything the space holds: it waits for a part with that
much time left while the trials that fit run, :mod:`tunekit.search.references`); a confirmation probe as long as its
own trial's probes took. Each is counted as it would run now that the output directory's compile cache holds its
graphs (:func:`warm_wall_s`: a probe that compiled cold counts without the compile a warm cache turns into loads),
else its timeout, the bound it runs under. A sampled trial is expected to take at least its runner's probes rescaled
to its knobs by the cost model's step ratio (:func:`scaled_probe_s`). A probe whose shapes no earlier probe compiled
runs longer than expected; when an outer timeout ends it, ``--resume`` probes it again. A search stopped at its
limit writes search.json saying so, with the command that continues it: ``--resume`` reads the study back and
repeats no finished probe, the confirmation round's included.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.estimate.costmodel import predict
from tunekit.estimate.profiles import PriceProfile
from tunekit.metrics import TIMING_STEP
from tunekit.rundir import read_config, read_summary
from tunekit.runners import runner_for
from tunekit.search.budget import KILL_GRACE_S

STOP = "time limit"
"""How a stop reason at the time limit begins."""
NEVER_FITS = "more than the whole --time-limit"
"""What a stop reason at the time limit says when no part of that limit could start the probe."""
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM); the running probe is retried on --resume"
"""The stop reason of a search interrupted by a signal."""


class Deferred(Exception):
    """A sampled trial whose runner's probes take longer than the time left: the search stops at its time limit
    (``reason``), the trial ends FAIL and ``--resume`` probes its configuration first
    (:func:`tunekit.search.storage.recover`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def runner_of(trial: optuna.trial.FrozenTrial) -> str | None:
    """The runner a trial's probe ran (recorded by the objective; an older study's trial: its sampled ``runner``)."""
    return trial.user_attrs.get("runner") or trial.params.get("runner")


def stopped(reason: str) -> bool:
    """Whether a search's stop reason is its time limit."""
    return reason.startswith(STOP)


_LONGER = ("give --time-limit more than that, or a shorter probe.timeout_s (a runner with no finished probe is "
           "expected to take its timeout and the kill grace)")


def never_fits(reason: str) -> bool:
    """Whether a search stopped at its time limit before a probe that no part of that limit could start."""
    return stopped(reason) and NEVER_FITS in reason


def check_first_part(recipe: Recipe, limit_s: float | None) -> None:
    """ConfigError when a new search's baseline could never start within ``limit_s``: no probe has finished, so it
    is expected to take ``probe.timeout_s`` and the kill grace."""
    first = recipe.probe.timeout_s + KILL_GRACE_S
    if limit_s is not None and first > limit_s:
        raise ConfigError(f"--time-limit {limit_s:g}: the search's first probe is expected to take {first:g} s "
                          f"(probe.timeout_s {recipe.probe.timeout_s:g} and the kill grace), {NEVER_FITS}; {_LONGER}.")


def resumable(reason: str) -> bool:
    """Whether a search stopped before its end (time limit or a signal), so ``--resume`` continues it."""
    return stopped(reason) or reason == INTERRUPTED


def warm_wall_s(summary: Mapping[str, Any]) -> float | None:
    """A finished probe's wall time as a repeat of its shapes would take it with the compile cache warm: ``wall_s``
    less the share of ``compile/backend_s`` (AOTAutograd and Inductor) spent on the cache lookups that missed; None
    without ``wall_s``."""
    if summary.get("wall_s") is None:
        return None
    wall = float(summary["wall_s"])
    hits, misses = int(summary.get("compile_cache/hits") or 0), int(summary.get("compile_cache/misses") or 0)
    if not misses:
        return wall
    return max(0.0, wall - float(summary.get("compile/backend_s") or 0.0) * misses / (hits + misses))


def expected_probe_s(trials: Iterable[optuna.trial.FrozenTrial], probes: Iterable[Mapping[str, Any]],
                     timeout_s: float, *, of: optuna.trial.FrozenTrial | None = None,
                     runners: Iterable[str] | None = None) -> float:
    """The wall time the next probe is expected to take, each finished probe counted at its ``warm_wall_s`` where
    recorded, else its ``wall_s``: for a confirmation probe of trial ``of``, the longest of that trial's own probes
    (its trial's and the round's, ``probes``, by their ``trial`` number); for a trial, the longest of the study's
    finished probes other than the references' (``search.references`` may set what the space never does, a slower
    trainer's defaults say, so they say little of the space's next trial), all of them where only references
    finished; else ``timeout_s`` and the kill grace. With ``runners`` (the runners the trial may run: one once it is
    sampled), the longest of the probes of each runner (:func:`runner_of`; a runner only a reference ran: the
    reference's, the one measure of that trainer on this workload; a runner none ran: ``timeout_s`` and the kill
    grace, as nothing says how long another trainer's start and steps take), the shortest of those: a trial's
    runners differ more in their probes' length (another trainer's steps and start) than its other knobs do; never more than ``timeout_s`` and the kill grace, the bound a trial's probe runs
    under."""
    trials = list(trials)
    numbers = {t.number: t for t in trials}

    def wall(rec: Mapping[str, Any]) -> float | None:
        value = rec.get("warm_wall_s", rec.get("wall_s"))
        return None if value is None else float(value)

    def longest(keep) -> float | None:
        walls = [w for t in trials if keep(t) and (w := wall(t.user_attrs)) is not None]
        walls += [w for p in probes if (t := numbers.get(p.get("trial"))) is None or keep(t)
                  if (w := wall(p)) is not None]
        return max(walls) if walls else None

    bound = timeout_s + KILL_GRACE_S
    if of is not None:  # a reference's round probe runs under its own timeout, which it may set
        found = longest(lambda t: t.number == of.number)
        return bound if found is None else found
    found = longest(lambda t: not t.user_attrs.get("reference"))
    found = longest(lambda t: True) if found is None else found
    if found is not None and runners is not None:
        each = [longest(lambda t, r=r: not t.user_attrs.get("reference") and runner_of(t) == r)
                or longest(lambda t, r=r: runner_of(t) == r) for r in runners]
        found = min((bound if e is None else e for e in each), default=found)
    return bound if found is None else min(found, bound)


def rescaled_probe_s(summary: Mapping[str, Any], ratio: float, steps: int) -> float | None:
    """A finished probe's wall time (:func:`warm_wall_s`) as a probe of ``steps`` steps, each ``ratio`` times its
    steady step, would take it: its one-time part (start-up, the warm-up steps' excess, teardown) as it ran, its
    steps rescaled. None without a wall time, a steady step or a step count."""
    wall, n = warm_wall_s(summary), summary.get("steps")
    step = (summary.get("steady") or {}).get(TIMING_STEP)
    if wall is None or not step or not n:
        return None
    return max(0.0, wall - n * float(step)) + steps * float(step) * ratio


def scaled_probe_s(recipe: Recipe, trials: Iterable[optuna.trial.FrozenTrial], profile: PriceProfile) -> float | None:
    """The longest of ``recipe``'s runner's finished trial probes (the references' aside) rescaled to ``recipe`` by
    the cost model: each probe's steps times the ratio of the model's step for ``recipe`` to its step for that
    probe's own configuration (:func:`rescaled_probe_s`; uncalibrated, since a ratio of two predictions of one
    runner cancels most of what a calibration would correct: TRL at micro-batch 16 steps twice as long as at 32,
    which the longest probe so far does not say). None where the model predicts nothing here (a profile without
    bandwidths, a model without shapes) or no such probe has its records."""
    run_dirs = [t.user_attrs["run_dir"] for t in trials if runner_of(t) == recipe.runner
                and t.user_attrs.get("status") == "ok" and t.user_attrs.get("run_dir")
                and not t.user_attrs.get("reference") and "duplicate_of" not in t.user_attrs]
    if not run_dirs:
        return None
    try:
        mine = predict(recipe, profile, runners=runner_for).step_s
    except TunekitError:
        return None
    found = []
    for run_dir in run_dirs:
        try:
            summary = read_summary(run_dir)
            theirs = predict(read_config(run_dir), profile, runners=runner_for).step_s
        except (OSError, ValueError, TunekitError):  # records moved or unreadable: that probe says nothing
            continue
        if summary and theirs > 0 and (s := rescaled_probe_s(summary, mine / theirs, recipe.probe.steps)) is not None:
            found.append(s)
    return max(found) if found else None


@dataclass
class Deadline:
    """``limit_s`` seconds from the search's start (None: no limit)."""

    limit_s: float | None
    start: float = field(default_factory=time.monotonic)
    probes: int = 0
    """Probes this part has started (:meth:`started`)."""

    def started(self) -> None:
        """A probe starts in this part."""
        self.probes += 1

    def why_not(self, expected_s: float, *, what: str = "the next probe", after: str = "") -> str | None:
        """Why a probe expected to take ``expected_s`` may not start (a stop reason naming it ``what``, with ``after``
        said before the resume command), None when it may."""
        if self.limit_s is None:
            return None
        used = time.monotonic() - self.start
        if used + expected_s <= self.limit_s:
            return None
        if not self.probes:  # this part started nothing: --resume with the same limit would stop here again
            return (f"{STOP}: {what} is expected to take {expected_s:.0f} s, {NEVER_FITS} {self.limit_s:g} s leaves "
                    f"once the search has started ({used:.0f} s in), so no part could start it; {_LONGER}, with --resume")
        return (f"{STOP}: {used:.0f} s of --time-limit {self.limit_s:g} s used and {what} is expected to take "
                f"{expected_s:.0f} s{after}; run the same command with --resume to continue (no finished probe is "
                "repeated)")
