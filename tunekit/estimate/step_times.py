"""What a probe's step records mean for timing: the profiler's own time, and which steps a projection reads.

The files themselves (names, writers, readers) are :mod:`tunekit.rundir`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit import metrics

if TYPE_CHECKING:  # only the callers' frames are read here
    import pandas as pd


def profiler_seconds(steps: pd.DataFrame) -> float:
    """The profiler's own time over a probe's steps (``profiler/overhead_s``, kept out of the step times)."""
    return float(steps[metrics.PROFILER_OVERHEAD_S].sum()) if metrics.PROFILER_OVERHEAD_S in steps else 0.0


def projection_step_times(steps: pd.DataFrame, warmup_steps: int) -> list[float]:
    """Step times a projection reads: the warm-up steps, then the steady steps :func:`metrics.timed_steps` keeps."""
    times = steps[metrics.TIMING_STEP].tolist()
    if metrics.COMM_SAMPLED not in steps:
        return times
    sampled = steps[metrics.COMM_SAMPLED].fillna(0).astype(bool).tolist()
    keep = [True] * warmup_steps + metrics.timed_steps(sampled[warmup_steps:])
    return [t for t, k in zip(times, keep) if k]
