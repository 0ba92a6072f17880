"""The probe budget: what a study has spent, what the next probe will cost, the best feasible value so far.

Spend lives in the trials' user attrs (``probe_yuan``), so ``--resume`` and other workers see it.
"""

from __future__ import annotations

import math
import statistics

import optuna
from optuna.trial import TrialState

from tunekit import cost
from tunekit.profiles import PriceProfile
from tunekit.search.storage import spend_of

CONFIRMED_ATTR = "confirmation_spent_yuan"
"""Study user attr: what every confirmation round of the study has spent (a resumed search confirms again)."""
KILL_GRACE_S = 5.0
"""Time the launcher may take to end a probe's tree after its timeout."""


def first_estimate(timeout_s: float, gpus: int, profile: PriceProfile) -> float:
    """The first probe's spend before anything was measured: its timeout (an upper bound) on its GPUs."""
    return cost.yuan(timeout_s + KILL_GRACE_S, gpus, profile)


def _probed(trials: list[optuna.trial.FrozenTrial]) -> list[float]:
    return [t.user_attrs["probe_yuan"] for t in trials if t.user_attrs.get("probe_yuan", 0) > 0]


def estimate_next(trials: list[optuna.trial.FrozenTrial], first: float) -> float:
    """Median spend of the probes so far, else the first probe's conservative estimate."""
    spends = _probed(trials)
    return statistics.median(spends) if spends else first


def spent(trials: list[optuna.trial.FrozenTrial], profile: PriceProfile) -> float:
    return sum(spend_of(t, profile) for t in trials)


def study_spent(study: optuna.Study, profile: PriceProfile) -> float:
    """Probe yuan of every trial and of every confirmation round of the study."""
    return spent(study.get_trials(deepcopy=False), profile) + float(study.user_attrs.get(CONFIRMED_ATTR, 0.0))


def best_feasible(trials: list[optuna.trial.FrozenTrial]) -> float | None:
    vals = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
            and all(v <= 0 for v in t.constraints.values())]
    return min(vals) if vals else None


