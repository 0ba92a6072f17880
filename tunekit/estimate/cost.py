"""What a probe cost and what the full run would cost, in yuan.

Pure functions of numbers the caller measured, no I/O; :func:`recipe_run_length` alone reads a recipe (its ``run``
and ``search`` keys), so the run-length rule is unpacked in one place.

- yuan           = seconds x GPUs held x price per GPU-second (:func:`yuan`, the one pricing rule)
- probe spend    = yuan(probe wall time)
- projected run  = yuan(fixed cost + warm-up steps as measured + the other steps x mean steady step time),
                   paid on every GPU the device map holds (idle ones too). The mean, not the median: a run's
                   wall time is the sum of its steps, and step times are right-skewed, so the median
                   prices a run low.
- run length     = the steps the full run needs (:func:`run_length`): its training samples over the samples a
                   step trains on, or the first step at which the smoothed reward reaches the threshold.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol

import pandas as pd

from tunekit import metrics
from tunekit.estimate.step_times import profiler_seconds, projection_step_times

if TYPE_CHECKING:
    from tunekit.config import Recipe

SECONDS_PER_HOUR = 3600.0


class Priced(Protocol):
    """Anything with a GPU-hour price; ``tunekit.estimate.profiles.PriceProfile`` is one."""

    @property
    def yuan_per_gpu_hour(self) -> float: ...


@dataclass(frozen=True)
class Spend:
    """Money already spent by a probe."""

    yuan: float
    gpu_hours: float


@dataclass(frozen=True)
class Projection:
    """Projected cost of the full training run from a probe's step times."""

    wall_s: float
    """startup_s + warm-up steps as measured + the other steps x mean_step_s."""
    gpu_hours: float
    """wall_s / 3600 x GPUs held."""
    yuan: float
    mean_step_s: float
    """Mean of the steady (post-warm-up) step times."""
    steady_steps: int
    """How many step times the mean was taken over."""
    extrapolated_from_warmup: bool = False
    """True when the probe had no steps past warm-up: its steps after the first stand in for steady ones (the first,
    which carries compilation and graph capture, is paid once as measured), or its one step for all."""
    paid_s: float = 0.0
    """What the run pays as measured: startup_s + the warm-up steps it runs."""
    steady_s: tuple[float, ...] = ()
    """The step times the mean was taken over."""
    rest_steps: int = 0
    """The steps the run pays at the mean (wall_s = paid_s + rest_steps x mean_step_s)."""
    evaluation_s: float = 0.0
    """The run's held-out evaluations (part of paid_s): the probe's evaluation seconds a step, times the run's steps."""


def yuan(seconds: float, gpus: int, profile: Priced) -> float:
    """Yuan for ``seconds`` of wall time on ``gpus`` GPUs at the profile's price per GPU-hour."""
    return seconds / SECONDS_PER_HOUR * gpus * profile.yuan_per_gpu_hour


def affordable_s(budget_yuan: float, gpus: int, profile: Priced) -> float:
    """Seconds of wall time on ``gpus`` GPUs that ``budget_yuan`` pays for (the inverse of :func:`yuan`)."""
    return budget_yuan / yuan(1.0, gpus, profile)


def probe_spend(wall_s: float, gpus_held: int, profile: Priced) -> Spend:
    """Yuan and GPU-hours a probe of ``wall_s`` seconds spent on ``gpus_held`` GPUs."""
    _check_nonnegative(wall_s=wall_s)
    _check_gpus(gpus_held)
    gpu_hours = wall_s / SECONDS_PER_HOUR * gpus_held
    return Spend(yuan=yuan(wall_s, gpus_held, profile), gpu_hours=gpu_hours)


def project_run(
    *,
    startup_s: float,
    step_times_s: list[float],
    warmup_steps: int,
    target_steps: int,
    gpus_held: int,
    profile: Priced,
) -> Projection:
    """Project wall time and yuan of a ``target_steps`` run from a probe's step times.

    The first ``warmup_steps`` step times (compilation, allocator growth, cache
    warm-up) are excluded from the mean, and the run pays for them as measured:
    ``startup_s`` + the warm-up steps + the other steps at the mean. If the probe
    has no steps past warm-up, all step times are used at their mean and
    ``extrapolated_from_warmup`` is set, so callers can flag the projection as pessimistic.
    """
    if not step_times_s:
        raise ValueError("step_times_s is empty: a projection needs at least one measured step")
    if warmup_steps < 0 or target_steps < 0:
        raise ValueError(
            f"warmup_steps ({warmup_steps}) and target_steps ({target_steps}) must be >= 0"
        )
    if not all(t >= 0 for t in step_times_s):  # also rejects NaN
        raise ValueError(f"step_times_s must all be >= 0 seconds, got {step_times_s}")
    _check_nonnegative(startup_s=startup_s)
    _check_gpus(gpus_held)

    warm_n = min(warmup_steps, len(step_times_s) - 1)  # as the trainer's steady medians read them
    steady = step_times_s[warm_n:]
    extrapolated = warm_n < warmup_steps
    mean_step_s = statistics.fmean(steady)
    warm = step_times_s[: min(warm_n, target_steps)]
    paid_s, rest_steps = startup_s + sum(warm), target_steps - len(warm)
    wall_s = paid_s + rest_steps * mean_step_s
    gpu_hours = wall_s / SECONDS_PER_HOUR * gpus_held
    return Projection(
        wall_s=wall_s,
        gpu_hours=gpu_hours,
        yuan=yuan(wall_s, gpus_held, profile),
        mean_step_s=mean_step_s,
        steady_steps=len(steady),
        extrapolated_from_warmup=extrapolated,
        paid_s=paid_s,
        steady_s=tuple(steady),
        rest_steps=rest_steps,
    )


def fixed_cost_s(*, wall_s: float, startup_s: float, step_times_s: list[float], profiler_s: float = 0.0) -> float:
    """What a run spends outside its steps, read off a probe: process start, imports, model and engine build,
    teardown. The probe's wall time less its steps and its profiler's own work (a training run does not
    profile); never less than the start-up the trainer itself measured."""
    return max(startup_s, wall_s - sum(step_times_s) - profiler_s)


def project_probe(steps: pd.DataFrame, *, wall_s: float, startup_s: float, warmup_steps: int, target_steps: int, gpus_held: int,
                  profile: Priced, overhead_s: float | None = None, eval_every: int = 0) -> Projection:
    """:func:`project_run` from a finished probe: its step records (``steps.parquet`` as a frame), wall time
    and start-up. The run pays the probe's fixed cost (:func:`fixed_cost_s`, less every step it ran and its
    profiler's work), its warm-up steps, and the rest at the mean of the steps not sampled for communication.
    ``overhead_s``: the run's one-time cost (:func:`one_time_s`) to pay instead of this probe's own: a cold
    start's, where this probe started warm (:mod:`tunekit.estimate.cold_start`). The probe's held-out evaluations
    (``eval/time_s``, outside its steps) are no one-time cost: the run evaluates as often (every ``eval_every``
    steps), so it pays one at their mean for each ``eval_every`` of its steps (without ``eval_every``, their seconds a
    step over its own steps) (:attr:`Projection.evaluation_s`).
    """
    evaluation = float(steps[metrics.EVAL_TIME_S].sum()) if metrics.EVAL_TIME_S in steps else 0.0
    fixed = fixed_cost_s(wall_s=wall_s, startup_s=startup_s, step_times_s=steps[metrics.TIMING_STEP].tolist(),
                         profiler_s=profiler_seconds(steps) + evaluation)
    proj = project_run(startup_s=fixed, step_times_s=projection_step_times(steps, warmup_steps),
                       warmup_steps=warmup_steps, target_steps=target_steps, gpus_held=gpus_held, profile=profile)
    if overhead_s is not None:
        _check_nonnegative(overhead_s=overhead_s)
        proj = _paying(proj, proj.wall_s + overhead_s - one_time_s(proj, target_steps), gpus_held, profile)
    if evaluation and len(steps):
        done = int(steps[metrics.EVAL_TIME_S].notna().sum())
        run_evaluation = (evaluation / done * (target_steps // eval_every) if eval_every and done else
                          evaluation * target_steps / len(steps))
        proj = replace(_paying(proj, proj.wall_s + run_evaluation, gpus_held, profile), evaluation_s=run_evaluation)
    return proj


def _paying(proj: Projection, wall: float, gpus_held: int, profile: Priced) -> Projection:
    """``proj`` with ``wall`` seconds of wall time, the difference paid as measured."""
    return replace(proj, wall_s=wall, gpu_hours=wall / SECONDS_PER_HOUR * gpus_held, yuan=yuan(wall, gpus_held, profile),
                   paid_s=proj.paid_s + wall - proj.wall_s)


def one_time_s(proj: Projection, target_steps: int) -> float:
    """What a projected run of ``target_steps`` pays once, above its steps at the mean steady step and its
    evaluations: start-up, teardown, and the warm-up steps' excess (compilation, CUDA-graph capture)."""
    return proj.wall_s - target_steps * proj.mean_step_s - proj.evaluation_s


def yuan_per_step(step_s: float, gpus_held: int, profile: Priced) -> float:
    """Yuan one training step of ``step_s`` seconds costs on ``gpus_held`` GPUs (``cost/yuan_per_step``)."""
    _check_nonnegative(step_s=step_s)
    _check_gpus(gpus_held)
    return yuan(step_s, gpus_held, profile)


def steps_to_threshold(rewards: Sequence[float], threshold: float, window: int) -> int | None:
    """The first step (1-based) at which the mean reward of the last ``window`` steps reaches ``threshold``;
    None when it never does. Only full windows count, so no run is shorter than ``window`` steps."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    smoothed = pd.Series(rewards, dtype=float).rolling(window).mean()
    hits = smoothed.index[smoothed >= threshold]
    return int(hits[0]) + 1 if len(hits) else None


@dataclass(frozen=True)
class RunLength:
    """How many steps the full run needs, and the rule that said so (for the user to read)."""

    steps: int | None
    """None: the run length is unknown (the threshold was not reached in the probe)."""
    rule: str


def run_length(*, until: Literal["samples", "threshold"], samples: int, samples_per_step: int, rewards: Sequence[float],
               threshold: float, window: int) -> RunLength:
    """The full run's steps: ``samples`` training samples at ``samples_per_step`` a step, or (``threshold``)
    the step at which the probe's smoothed reward first reaches ``threshold`` (:func:`steps_to_threshold`)."""
    if until == "samples":
        steps = -(-samples // samples_per_step)
        return RunLength(steps, f"{samples} samples at {samples_per_step} a step")
    steps = steps_to_threshold(rewards, threshold, window)
    if steps is None:
        return RunLength(None, f"the {window}-step mean reward never reached {threshold:g} in the probe's "
                               f"{len(rewards)} steps: infeasible, not extrapolated")
    return RunLength(steps, f"the {window}-step mean reward first reached {threshold:g} at step {steps}")


def recipe_run_length(recipe: Recipe, rewards: Sequence[float]) -> RunLength:
    """:func:`run_length` under ``recipe``'s ``run.*`` and ``search.reward_threshold`` / ``reward_window``, on the
    reward curve ``rewards`` (empty: none yet)."""
    return run_length(until=recipe.run.until, samples=recipe.run.samples,
                      samples_per_step=recipe.system.batch.samples_per_step, rewards=rewards,
                      threshold=recipe.search.reward_threshold, window=recipe.search.reward_window)


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:  # also rejects NaN
            raise ValueError(f"{name} must be >= 0 seconds, got {value}")


def _check_gpus(count: int) -> None:
    if count < 1:
        raise ValueError(f"gpus_held must be >= 1, got {count}")
