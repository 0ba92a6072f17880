"""Reward intervals, the feasibility verdict and paired cost ratios: pure functions of numbers.

Reward interval. A trial's reward is the mean of its last ``search.reward_window``
steps; its interval is Student's t interval of that mean over the window's steps
(``LEVEL`` coverage; a window of 10 steps has 9 degrees of freedom, and a percentile
bootstrap of so few steps covers about 90% where it claims 95%). Over several seeds
the seeds' means are averaged, the noise inside their windows adds up as a stratified
mean's does (Welch-Satterthwaite's degrees of freedom), and each side is widened in
quadrature by the seeds' own spread (Student's t on k - 1 degrees of freedom times the
standard error of their means, counting only the variance of the means beyond what their
windows' noise gives them), so two seeds that each sit still but apart get the width their
disagreement earns. Simulated with windows of ten steps: seeds that differ only by that noise
are covered 97% of the time; seeds whose levels really differ, 86% (two seeds) to 93% (five),
where the normal quantile gave 78% to 83%, at a width two seeds that disagree pay for.
Assumption: the window's steps are exchangeable draws around a level; a trend inside the
window or correlated neighbouring steps make the interval somewhat narrow, which is why the
confirmation round adds fresh seeds.

Held-out reward interval. With ``search.reward_metric: eval/reward_mean`` a probe records one number an
evaluation (every ``probe.eval_every`` steps), and the window's steps repeat the latest, so resampling them says
nothing of the evaluation's own noise: it is the mean of one greedy response to each of n held-out prompts. Rewards
inside ``task.reward_range`` [lo, hi] with mean p vary by at most (p - lo)(hi - p) (the Bhatia-Davis inequality;
equality for rewards that are all lo or hi, as an exact-answer reward is), so the interval is the set of means p
the observed one is within the normal quantile of under that bound: Wilson's score interval, on the range scaled
to [0, 1] (for a right-or-wrong reward, exactly Wilson's interval of the share right). Unlike a normal interval
around the observed mean it keeps a width at 0 and 1. A window's evaluations repeat the same prompts, and so do
the seeds' probes: the mean over k seeds still rests on n prompts, so Wilson's interval is taken at n, and the
seeds' own spread (the variance of their means over k) widens each side in quadrature, at Student's t on k - 1
degrees of freedom, as the training reward's does.

Verdict. ``feasible`` when the interval's low end is at or above the threshold,
``infeasible`` when its high end is below it, ``within noise`` otherwise.

Paired ratios. In the confirmation round a candidate and the reference (the
baseline) run back to back once per seed, so both see the same machine. Each
round gives the ratio of their projected GPU-seconds (fixed cost and warm-up as
measured, the other steps at the mean steady step time, times GPUs held; the
price cancels); the rounds combine by their geometric mean. The interval
bootstraps each probe's steady step times (the mean step is the noisy part of a
projection) and recomputes the combined ratio.

Telling two configurations apart (``compare``). The bootstrap interval sees the
noise inside each probe only; a loaded machine also changes from round to round,
and a run until the threshold has a length read off one seed's curve. So two
configurations are told apart only when, besides the bootstrap interval and every
round agreeing, the t interval from how far the round's paired ratios move from
round to round (``round_spread``) is clear of 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

LEVEL = 0.95
"""Coverage of every interval."""
BOOTSTRAP = 2000
"""Bootstrap replicates: the 2.5% and 97.5% quantiles move by well under a standard error between seeds."""

Verdict = Literal["feasible", "within noise", "infeasible"]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its ``LEVEL`` interval."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _quantiles(boots: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def reward_interval(windows: Sequence[Sequence[float]], bounds: tuple[float, float] | None = None) -> Interval:
    """Mean over seeds of each seed's window mean, with its ``LEVEL`` interval (the module's docstring): Student's t
    over the windows' steps, widened by the seeds' spread, and kept inside ``bounds`` (the task's reward range: no
    mean lies outside it).

    ``windows``: one sequence of per-step mean rewards per seed (the last ``reward_window`` steps of each probe).
    """
    found = _reward_interval(windows)
    if bounds is None or not bounds[0] <= found.value <= bounds[1]:  # a reward outside its stated range: as it is
        return found
    return Interval(found.value, max(bounds[0], found.low), min(bounds[1], found.high))


def _reward_interval(windows: Sequence[Sequence[float]]) -> Interval:
    windows = [np.asarray(w, dtype=float) for w in windows if len(w)]
    if not windows:
        raise ValueError("no reward to take an interval of: every window is empty")
    means = [float(w.mean()) for w in windows]
    value = statistics.fmean(means)
    # each seed's mean's variance from its window's steps; the seeds' average has their sum over k^2
    parts = [(float(w.var(ddof=1)) / len(w), len(w) - 1) for w in windows if len(w) > 1]
    total = sum(v for v, _ in parts)
    # the seeds' means spread by their windows' noise too: only what lies beyond it is the seeds' own
    within = total / len(parts) if parts else 0.0
    if total == 0:
        return Interval(value, *_widened(value, value, value, means, LEVEL))
    df = total ** 2 / sum(v * v / d for v, d in parts if v)  # Welch-Satterthwaite
    half = t975(max(1, math.floor(df))) * math.sqrt(total) / len(windows)
    return Interval(value, *_widened(value, value - half, value + half, means, LEVEL, within=within))


def _widened(value: float, low: float, high: float, means: Sequence[float], level: float, *,
             within: float = 0.0) -> tuple[float, float]:
    """``[low, high]`` around ``value`` with each side widened in quadrature by the seeds' spread: Student's t on
    k - 1 degrees of freedom times the standard error of the k seeds' ``means`` (none for one seed), counting only
    the variance of the means beyond ``within``, what noise already in ``[low, high]`` gives a seed's mean. A few
    seeds estimate their spread loosely: the t quantile (12.7 for two seeds, 4.3 for three) pays for it."""
    if len(means) < 2:
        return low, high
    quantile = t975(len(means) - 1) if level == LEVEL else statistics.NormalDist().inv_cdf((1 + level) / 2)
    seeds = quantile * math.sqrt(max(0.0, statistics.variance(means) - within) / len(means))
    return value - math.hypot(value - low, seeds), value + math.hypot(high - value, seeds)


def held_out_interval(evaluations: Sequence[Sequence[float]], prompts: int, reward_range: tuple[float, float], *,
                      level: float = LEVEL) -> Interval:
    """Mean over seeds of each seed's mean evaluation, with the Wilson score interval of the module's docstring,
    widened by the seeds' spread.

    ``evaluations``: per seed, the held-out mean rewards of the evaluations its window holds; ``prompts``: the
    held-out prompts each evaluation scores.
    """
    means = [statistics.fmean(e) for e in evaluations if len(e)]
    if not means:
        raise ValueError("no evaluation to take an interval of: every window is empty")
    lo, hi = reward_range
    value = statistics.fmean(means)
    share, n = min(1.0, max(0.0, (value - lo) / (hi - lo))), prompts
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    low, high = _widened(value, lo + (hi - lo) * max(0.0, centre - half), lo + (hi - lo) * min(1.0, centre + half),
                         means, level)
    return Interval(value, max(lo, low), min(hi, high))


def verdict(reward: Interval, threshold: float) -> Verdict:
    """``feasible`` / ``infeasible`` when the whole interval is on one side of ``threshold``, else ``within noise``."""
    if reward.low >= threshold:
        return "feasible"
    if reward.high < threshold:
        return "infeasible"
    return "within noise"


@dataclass(frozen=True)
class Measured:
    """What a projection needs from one probe: the parts of a run's wall time, and the GPUs that pay for it."""

    fixed_s: float
    """Start-up, teardown and the warm-up steps, as measured."""
    steady_s: Sequence[float]
    """Steady step times (the mean of these prices the rest of the run)."""
    rest_steps: int
    """Steps of the full run paid at the mean steady step."""
    gpus: int

    def gpu_seconds(self, mean_step_s: float | np.ndarray | None = None) -> float | np.ndarray:
        step = statistics.fmean(self.steady_s) if mean_step_s is None else mean_step_s
        return self.gpus * (self.fixed_s + self.rest_steps * step)


@dataclass(frozen=True)
class Ratio:
    """Candidate over reference, combined over rounds, with its interval and each round's own ratio."""

    value: float
    low: float
    high: float
    per_round: list[float]

    def as_dict(self) -> dict[str, float | list[float]]:
        return {"ratio": self.value, "ci": [self.low, self.high], "per_round": self.per_round}


def _boot_means(steps: Sequence[float], rng: np.random.Generator, n: int) -> np.ndarray:
    s = np.asarray(steps, dtype=float)
    return s[rng.integers(0, len(s), size=(n, len(s)))].mean(axis=1)


def paired_ratio(rounds: Sequence[tuple[Measured, Measured]], *, level: float = LEVEL, n: int = BOOTSTRAP,
                 seed: int = 0) -> Ratio:
    """Geometric mean over rounds of candidate / reference GPU-seconds, each round's pair measured back to back."""
    if not rounds:
        raise ValueError("a paired ratio needs at least one round")
    rng = np.random.default_rng(seed)
    per_round = [float(c.gpu_seconds() / r.gpu_seconds()) for c, r in rounds]
    logs = np.zeros(n)
    for c, r in rounds:
        logs += np.log(c.gpu_seconds(_boot_means(c.steady_s, rng, n)) / r.gpu_seconds(_boot_means(r.steady_s, rng, n)))
    value = math.exp(statistics.fmean(math.log(x) for x in per_round))
    return Ratio(value, *_quantiles(np.exp(logs / len(rounds)), level), per_round)


# ---------------------------------------------------------------- telling two configurations apart

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
"""Student's t 97.5% quantile by degrees of freedom (a df between two entries takes the smaller one's, the wider)."""


def t975(df: int) -> float:
    """Two-sided 95% Student's t quantile for ``df`` degrees of freedom (1.96 beyond the table)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > max(T975):
        return 1.96
    return T975[max(k for k in T975 if k <= df)]


@dataclass(frozen=True)
class Spread:
    """How far a paired ratio moves from round to round: the pooled standard deviation of the per-round log ratios
    about each pair's mean, and its degrees of freedom."""

    sd: float
    df: int


def round_spread(per_round: Sequence[Sequence[float]]) -> Spread | None:
    """Pooled round-to-round standard deviation of log ratios (a randomized block design's residual, rounds the
    blocks); ``per_round``: one list of per-round ratios per pair, each candidate over the same reference. None when
    no pair has two rounds."""
    logs = [np.log(np.asarray(r, dtype=float)) for r in per_round if len(r) >= 2]
    df = sum(len(x) - 1 for x in logs)
    if not df:
        return None
    ss = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    return Spread(math.sqrt(ss / df), df)


@dataclass(frozen=True)
class Comparison:
    """Candidate over reference in the confirmation round, and whether the round tells them apart."""

    ratio: Ratio
    """Paired ratio of projected GPU-seconds, bootstrap interval over steady steps."""
    noise: tuple[float, float] | None
    """The ratio's Student's t interval from the round-to-round spread of paired ratios."""
    apart: bool
    why: str
    """When not apart, what keeps them together; empty when apart."""

    def as_dict(self) -> dict[str, object]:
        return {**self.ratio.as_dict(), "noise_ci": list(self.noise) if self.noise else None, "apart": self.apart,
                "why": self.why}


def compare(rounds: Sequence[tuple[Measured, Measured]], spread: Spread | None) -> Comparison:
    """Tell two configurations apart, or say they are within noise.

    Apart only when all four hold: two rounds or more (one round cannot tell the configuration from the order its
    probes ran in); every round on the same side of 1; the paired bootstrap interval clear of 1; and the Student's t
    interval of the mean log ratio clear of 1: exp(log ratio +- t x sd / sqrt(rounds)), sd the round-to-round spread
    of the round's paired ratios (``round_spread``). The bootstrap sees only the noise inside each probe; load that
    changes from one round to the next, and a run length read off one seed's reward curve, show in how far a pair's
    ratio moves between rounds.
    """
    r = paired_ratio(rounds)
    noise = None
    if spread is not None:
        half = t975(spread.df) * spread.sd / math.sqrt(len(rounds))
        noise = (math.exp(math.log(r.value) - half), math.exp(math.log(r.value) + half))
    below, above = all(x < 1.0 for x in r.per_round), all(x > 1.0 for x in r.per_round)
    if len(rounds) < 2:
        why = "in one round, which cannot tell the configuration from the order the probes ran in"
    elif not (below or above):
        why = f"not on one side in every round ({', '.join(f'{x:.3f}' for x in r.per_round)})"
    elif r.low <= 1.0 <= r.high:
        why = f"the paired interval [{r.low:.3f}, {r.high:.3f}] holds 1"
    elif noise is None or noise[0] <= 1.0 <= noise[1]:
        why = ("no pair ran two rounds to measure the round-to-round noise" if noise is None else
               f"by less than the paired ratios move from round to round ({100 * spread.sd:.1f}% sd, {spread.df} df; "
               f"[{noise[0]:.3f}, {noise[1]:.3f}] holds 1)")
    else:
        why = ""
    return Comparison(r, noise, not why, why)
