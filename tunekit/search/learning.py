""""Systems knobs must not change learning": compare reward curves of trials that differ only in them.

Pure functions of numbers (reward curves and parameter dicts); the search feeds them. Which keys are
systems knobs is the recipe's own declaration (``tunekit.config.effect_of``).

Noise bound. Under the hypothesis that a systems knob leaves learning alone, two
probes with the same seed draw their per-step mean rewards from the same process
(bitwise equal at best; independent sampling noise at worst, once float
summation order or the per-rank sampling differs). The mean of ``K`` per-step
rewards then has standard error ``s/sqrt(K)`` with ``s`` the sample standard
deviation of those steps, and the difference of two such means has standard
error ``sqrt(se1^2 + se2^2)``. A pair is reported when the difference passes
``Z`` (3) of those standard errors, both over the last window (what feasibility
reads) and over the whole curve: about a 0.3% false-alarm rate per comparison
for normal noise, and a trend inside the window only inflates ``s``, so a flag
means a real divergence. A floor of ``MIN_BOUND`` keeps bitwise-identical noiseless
curves from flagging rounding.

Over seeds. Once the layouts differ (ranks, micro-batches, a compiled model), two probes follow different
trajectories, and the spread between whole runs exceeds the per-step noise above. Where a confirmation round ran
both trials of a flagged pair with fresh seeds, the pair is decided again over the seeds: the difference of
their per-seed last-window means against ``Z`` standard errors of that difference (each side's seed-to-seed
standard deviation over the square root of its seed count). A pair that stays apart is reported; one that
comes within that bound is cleared, and says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tunekit.config import effect_of

Z = 3.0
MIN_BOUND = 1e-3


def is_systems_key(key: str) -> bool:
    """A key the recipe declares systems-only (``tunekit.config.effect_of``): it must not change learning."""
    return effect_of(key) == "systems"


def differs_only_in_systems(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str] | None:
    """The systems keys in which two effective configurations differ, or None if a learning key differs too."""
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if not diff or not all(is_systems_key(k) for k in diff):
        return None
    return diff


def _mean_se(xs: Sequence[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return m, se


def compare(r1: Sequence[float], r2: Sequence[float], window: int) -> dict[str, float]:
    """Differences of the last-window and whole-curve mean rewards, each with its Z-sigma bound."""
    n = min(len(r1), len(r2))
    r1, r2 = list(r1[:n]), list(r2[:n])
    out = {}
    for name, (a, b) in {"last": (r1[-window:], r2[-window:]), "curve": (r1, r2)}.items():
        (m1, s1), (m2, s2) = _mean_se(a), _mean_se(b)
        out[f"{name}_diff"] = abs(m1 - m2)
        out[f"{name}_bound"] = max(MIN_BOUND, Z * math.hypot(s1, s2))
    return out


@dataclass
class Mismatch:
    """Two trials whose probes ended ok, that differ only in systems knobs but learned differently."""

    trial_a: int
    trial_b: int
    knobs: list[str]
    last_diff: float
    last_bound: float
    curve_diff: float
    curve_bound: float
    seeds: dict[str, Any] | None = None
    """The pair decided again over a confirmation round's seeds (:func:`over_seeds`), when it ran both."""

    @property
    def holds(self) -> bool:
        """Whether the pair learned differently: over the seeds when they were compared, else over one probe each."""
        return self.seeds is None or self.seeds["diff"] > self.seeds["bound"]

    def sentence(self) -> str:
        one = (f"trials {self.trial_a} and {self.trial_b} differ only in {', '.join(self.knobs)} but their reward differs by "
               f"{self.last_diff:.3f} over the last window (noise bound {self.last_bound:.3f}) and {self.curve_diff:.3f} over "
               f"the curve (bound {self.curve_bound:.3f})")
        if self.seeds is None:
            return one + ": a systems knob changed learning (a bug, or an off-policy backend)."
        over = (f"over {self.seeds['n'][0]} and {self.seeds['n'][1]} seeds (the confirmation round's) by {self.seeds['diff']:.3f}, "
                f"seed-to-seed bound {self.seeds['bound']:.3f}")
        if self.holds:
            return f"{one}, and {over}: a systems knob changed learning (a bug, or an off-policy backend)."
        return f"{one} in one probe each, but {over}: they learn alike within the seeds' spread."

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"holds": self.holds, "sentence": self.sentence()}


def over_seeds(a: Sequence[float], b: Sequence[float]) -> dict[str, Any] | None:
    """Two configurations' per-seed last-window mean rewards compared: the difference of their means and its bound,
    ``Z`` x sqrt(sd_a^2/n_a + sd_b^2/n_b); None unless each has two seeds or more."""
    if min(len(a), len(b)) < 2:
        return None
    (ma, sa), (mb, sb) = _mean_se(a), _mean_se(b)
    return {"diff": abs(ma - mb), "bound": max(MIN_BOUND, Z * math.hypot(sa, sb)), "n": [len(a), len(b)]}


def check_pairs(trials: Sequence[tuple[int, Mapping[str, Any], Sequence[float]]], window: int,
                seed_rewards: Mapping[int, Sequence[float]] | None = None) -> tuple[int, list[Mismatch]]:
    """Compare every pair of (number, effective config, reward curve); returns (pairs compared, pairs flagged).
    ``seed_rewards``: per trial, its per-seed last-window means where a confirmation round ran it; a flagged pair
    with both trials there is decided again over them (:attr:`Mismatch.holds`)."""
    seed_rewards = seed_rewards or {}
    compared, found = 0, []
    for i, (na, ca, ra) in enumerate(trials):
        for nb, cb, rb in trials[i + 1:]:
            knobs = differs_only_in_systems(ca, cb)
            if knobs is None or min(len(ra), len(rb)) < 2:
                continue
            compared += 1
            c = compare(ra, rb, window)
            if c["last_diff"] > c["last_bound"] or c["curve_diff"] > c["curve_bound"]:
                seeds = over_seeds(seed_rewards.get(na, []), seed_rewards.get(nb, []))
                found.append(Mismatch(na, nb, knobs, **c, seeds=seeds))
    return compared, found
