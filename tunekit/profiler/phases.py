"""Per-phase wall time and allocator peaks for one training step.

The training loop owns a :class:`PhaseTimer` and wraps each named phase of a
step (``gen``, ``ref``, ``update_actor``, ...) in ``timer.phase(name)``. Like
verl's ``marked_timer``, elapsed seconds are *added* into a dict the caller
reads, so a phase entered twice in one step sums. Unlike it, the device is
synchronised on both edges, so asynchronous CUDA work is charged to the phase
that launched it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tunekit.metrics import GIB, RESPONSE_LENGTH_MEAN, timed_steps
from tunekit.profiler.gc_pauses import GcPauses

if TYPE_CHECKING:
    from tunekit.profiler.comm import CommProfiler

_STEADY_PREFIXES = ("timing_s/", "perf/", "comm/", RESPONSE_LENGTH_MEAN)  # the length: the MFU's LM-head tokens
_PEAK_PREFIX = "perf/max_memory_"
# GC pauses are rare and long: most steps have none, so the median would hide them; the mean is what they
# cost a step on average
_MEAN_PREFIX = "perf/gc_"


@dataclass
class _OpenPhase:
    """Allocator peaks seen so far by a phase that has not ended yet."""

    allocated_gb: float = 0.0
    reserved_gb: float = 0.0


class PhaseTimer:
    """Times the phases of each training step; never logs.

    Metric keys written into :attr:`metrics` (and returned by :meth:`end_step`):

    - ``timing_s/<phase>``: seconds, summed over every entry of the phase.
    - ``timing_s/step``: wall seconds from :meth:`start_step` to :meth:`end_step`.
    - CUDA only: ``perf/max_memory_allocated_gb/<phase>``,
      ``perf/max_memory_reserved_gb/<phase>`` (allocator peak during the phase,
      GiB) and step-level ``perf/max_memory_allocated_gb`` /
      ``perf/max_memory_reserved_gb`` (max over the step's phases).
    - ``perf/gc_s`` and ``perf/gc_s/<phase>``: seconds the interpreter spent collecting garbage in the step
      and in each phase; ``perf/gc_full_collections``: how many of those collections were full.
    - whatever an attached :class:`~tunekit.profiler.comm.CommProfiler` measured.
    """

    def __init__(self, device: torch.device | str, *, comm: CommProfiler | None = None) -> None:
        """Args:
        device: the device the loop computes on; ``cuda`` enables synchronisation
            and allocator peaks, anything else is timed on the host clock only.
        comm: optional communication profiler whose ``phase(name)`` wraps every phase.
        """
        self.device = torch.device(device)
        self.comm = comm
        self.metrics: dict[str, float] = {}
        self._track_memory = self.device.type == "cuda"
        self._open: list[_OpenPhase] = []
        self._step = -1
        self._step_start: float | None = None
        self._gc = GcPauses()
        self._gc_outside = (0.0, 0)  # (seconds, full collections) of GC inside the profiler's own time, not the step's

    def start_step(self, step: int | None = None) -> None:
        """Clear the metrics and start the step clock (``step`` defaults to previous + 1)."""
        self._step = self._step + 1 if step is None else step
        self.metrics = {}
        self._open = []
        self._sync()
        self._gc.start()
        self._gc_outside = (0.0, 0)
        self._step_start = time.perf_counter()
        if self.comm is not None:  # its warm-up session (in the step before the first window) is the profiler's cost
            self.comm.start_step(self._step)
            self.metrics["profiler/overhead_s"] = time.perf_counter() - self._step_start
            self._gc_outside = (self._gc.seconds, self._gc.full)

    def end_step(self) -> dict[str, float]:
        """Return a copy of the step's metrics, including ``timing_s/step``."""
        if self._step_start is None:
            raise RuntimeError("PhaseTimer.end_step() called without a matching start_step().")
        self._sync()
        self.metrics["timing_s/step"] = time.perf_counter() - self._step_start - self.metrics.get("profiler/overhead_s", 0.0)
        self._step_start = None
        self._gc.stop()
        self.metrics["perf/gc_s"] = self._gc.seconds - self._gc_outside[0]
        self.metrics["perf/gc_full_collections"] = float(self._gc.full - self._gc_outside[1])
        if self.comm is not None:
            self.metrics.update(self.comm.end_step())
        return dict(self.metrics)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as phase ``name``; nothing is recorded if the body raises."""
        # The comm profiler starts outside the timed region so that its own
        # start/stop cost (about a second the first time) is not charged to the phase.
        comm_ctx = self.comm.phase(name) if self.comm is not None else nullcontext()
        outer, gc_outer = time.perf_counter(), (self._gc.seconds, self._gc.full)
        inner, gc_inner = 0.0, (0.0, 0)
        with comm_ctx:
            self._sync()
            if self._track_memory:
                self._enter_memory()
            start, gc_start, full_start = time.perf_counter(), self._gc.seconds, self._gc.full
            try:
                yield
            except BaseException:
                if self._track_memory:
                    self._open.pop()
                raise
            self._sync()
            key = f"timing_s/{name}"
            inner = time.perf_counter() - start
            self.metrics[key] = self.metrics.get(key, 0.0) + inner
            gc_inner = (self._gc.seconds - gc_start, self._gc.full - full_start)
            gc_key = f"perf/gc_s/{name}"
            self.metrics[gc_key] = self.metrics.get(gc_key, 0.0) + gc_inner[0]
            if self._track_memory:
                self._exit_memory(name)
        # what the profiler itself cost (starting/stopping torch.profiler) is kept out of timing_s/step
        overhead = time.perf_counter() - outer - inner
        self.metrics["profiler/overhead_s"] = self.metrics.get("profiler/overhead_s", 0.0) + overhead
        # and a collection during it is the profiler's too (its start/stop allocates), not the step's
        seconds, full = self._gc_outside
        self._gc_outside = (seconds + self._gc.seconds - gc_outer[0] - gc_inner[0],
                            full + self._gc.full - gc_outer[1] - gc_inner[1])

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _read_peaks(self) -> tuple[float, float]:
        """Allocator (allocated, reserved) peaks in GiB since the last reset."""
        return (
            torch.cuda.max_memory_allocated(self.device) / GIB,
            torch.cuda.max_memory_reserved(self.device) / GIB,
        )

    def _reset_peaks(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def _fold_peaks(self) -> None:
        """Credit the peaks since the last reset to every phase still open."""
        if not self._open:
            return
        allocated, reserved = self._read_peaks()
        for open_phase in self._open:
            open_phase.allocated_gb = max(open_phase.allocated_gb, allocated)
            open_phase.reserved_gb = max(open_phase.reserved_gb, reserved)

    def _enter_memory(self) -> None:
        # Folding before the reset keeps an enclosing phase's peak correct when phases nest.
        self._fold_peaks()
        self._reset_peaks()
        self._open.append(_OpenPhase())

    def _exit_memory(self, name: str) -> None:
        self._fold_peaks()
        done = self._open.pop()
        for kind, value in (("allocated", done.allocated_gb), ("reserved", done.reserved_gb)):
            for key in (f"{_PEAK_PREFIX}{kind}_gb/{name}", f"{_PEAK_PREFIX}{kind}_gb"):
                self.metrics[key] = max(self.metrics.get(key, 0.0), value)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not math.isnan(value)
    )


def steady_summary(rows: list[dict[str, Any]], warmup_steps: int) -> dict[str, float]:
    """Summarise the steady-state steps of a probe.

    Rows are per-step metric dicts in step order; row ``i`` is step ``i``.
    Steps ``i < warmup_steps`` are skipped. Every numeric ``timing_s/*``,
    ``perf/*`` and ``comm/*`` key, and ``response_length/mean``, gets the median over the steady rows that
    carry it (comm keys exist only on sampled steps), except
    ``perf/max_memory_*`` keys, which get the max, and ``perf/gc_*`` keys, which get the mean. ``timing_s/*`` medians are over the
    steps :func:`~tunekit.metrics.timed_steps` keeps (not sampled for communication).

    Raises:
        ValueError: if ``warmup_steps`` is negative or leaves no steady step.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    steady = rows[warmup_steps:]
    if not steady:
        raise ValueError(
            f"warmup_steps={warmup_steps} leaves no steady step out of {len(rows)}; "
            "run more steps or lower the warm-up."
        )
    timed = timed_steps([bool(r.get("comm/sampled")) for r in steady])
    values: dict[str, list[float]] = {}
    for row, keep_timing in zip(steady, timed):
        for key, value in row.items():
            if not keep_timing and key.startswith("timing_s/"):
                continue
            if key.startswith(_STEADY_PREFIXES) and _is_number(value):
                values.setdefault(key, []).append(float(value))
    return {key: _aggregate(key, vals) for key, vals in sorted(values.items())}


def steady_from_steps(steps, warmup_steps: int) -> dict[str, float]:
    """:func:`steady_summary` over step records read back as a frame (``rundir.read_steps``), where a NaN is a key
    that step did not record (so an unsampled step's missing ``comm/sampled`` does not read as sampled)."""
    return steady_summary([{k: v for k, v in r.items() if v == v} for r in steps.to_dict("records")], warmup_steps)


def _aggregate(key: str, vals: list[float]) -> float:
    if key.startswith(_PEAK_PREFIX):
        return max(vals)
    return statistics.fmean(vals) if key.startswith(_MEAN_PREFIX) else statistics.median(vals)
