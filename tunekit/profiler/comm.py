"""Communication time per phase, measured with torch.profiler on sampled steps.

Two methods, picked by device type:

- ``cuda_kernels``: NCCL kernels are read from the device timeline. Their
  union is ``comm/total_s/<phase>``; the part of it not overlapped by compute
  kernels is ``comm/exposed_s/<phase>`` (the interval sweep Holistic Trace
  Analysis uses). ``comm/wait_s/<phase>`` equals the exposed time: that is
  what communication costs the step.
- ``cpu_gloo``: gloo runs no kernels. Its collectives execute on a gloo worker
  thread and are recorded as ``gloo:<op>`` spans (torch 2.13 also records a
  short ``c10d::<op>_`` enqueue on the caller's thread); a span lasts until
  every peer has arrived, so the union of those spans is the collective wait,
  ``comm/wait_s/<phase>``.

``comm/bytes/<phase>`` sums the input tensor bytes of the ``nccl:*`` /
``gloo:*`` collectives when the profiler recorded their shapes and dtypes.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

Interval = tuple[float, float]
T = TypeVar("T")

_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:ncclDevKernel|ncclKernel|ncclSymk)")
_MEMORY_OP = re.compile(r"^(?:Memcpy|Memset)")
_COLLECTIVE_PREFIXES = ("nccl:", "gloo:")
_DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points; empty ones dropped."""
    merged: list[Interval] = []
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposed_comm(
    comm_intervals: Iterable[Interval], compute_intervals: Iterable[Interval]
) -> tuple[float, float]:
    """Return ``(total_s, exposed_s)`` of communication.

    ``total_s`` is the length of the union of the comm intervals (overlapping
    comm kernels count once); ``exposed_s`` is the part of that union not
    covered by the union of the compute intervals. Intervals are
    ``(start, end)`` in seconds.
    """
    comm = _union(comm_intervals)
    total = sum(end - start for start, end in comm)
    return total, max(0.0, total - _overlap(comm, _union(compute_intervals)))


def classify_kernel(name: str) -> Literal["comm", "compute"]:
    """``"comm"`` for NCCL kernels (``ncclDevKernel*``, ``ncclKernel*``, ``ncclSymk*``)."""
    return "comm" if _COMM_KERNEL.match(name) else "compute"


def _seconds(event: Any) -> Interval:
    return event.time_range.start * 1e-6, event.time_range.end * 1e-6


def _collective_bytes(events: Iterable[Any]) -> float | None:
    """Input bytes of the recorded collectives, or None when none carried shapes."""
    total, seen = 0, False
    for ev in events:
        if not ev.name.startswith(_COLLECTIVE_PREFIXES):
            continue
        for shape, dtype in zip(ev.input_shapes or [], ev.input_dtypes or []):
            if shape and dtype in _DTYPE_BYTES:
                total += math.prod(shape) * _DTYPE_BYTES[dtype]
                seen = True
    return float(total) if seen else None


def device_comm_metrics(events: Iterable[Any], phase: str) -> dict[str, float]:
    """``comm/{total,exposed,wait}_s/<phase>`` from CUDA kernel events.

    Comm and compute are compared per device (memcpy/memset count as neither);
    with several devices in one process the largest value is reported.
    """
    per_device: dict[int, tuple[list[Interval], list[Interval]]] = {}
    for ev in events:
        if ev.device_type != DeviceType.CUDA or _MEMORY_OP.match(ev.name):
            continue
        comm, compute = per_device.setdefault(ev.device_index, ([], []))
        (comm if classify_kernel(ev.name) == "comm" else compute).append(_seconds(ev))
    results = [exposed_comm(comm, compute) for comm, compute in per_device.values()]
    total = max((r[0] for r in results), default=0.0)
    exposed = max((r[1] for r in results), default=0.0)
    return {
        f"comm/total_s/{phase}": total,
        f"comm/exposed_s/{phase}": exposed,
        f"comm/wait_s/{phase}": exposed,
    }


def host_comm_metrics(events: Iterable[Any], phase: str) -> dict[str, float]:
    """``comm/wait_s/<phase>``: union of ``gloo:*`` spans (``c10d::*`` if there are none)."""
    events = list(events)
    spans = [_seconds(ev) for ev in events if ev.name.startswith("gloo:")]
    if not spans:
        spans = [_seconds(ev) for ev in events if ev.name.startswith("c10d::")]
    wait, _ = exposed_comm(spans, [])
    return {f"comm/wait_s/{phase}": wait}


def timed_collective_wait(
    fn: Callable[[], T], *, device: torch.device | None = None
) -> tuple[T, float]:
    """Call ``fn`` (one collective), wait for it, and return ``(result, seconds)``.

    An async ``Work`` handle returned by ``fn`` is waited on; on CUDA the
    device is synchronised too, since NCCL returns before the kernel finishes.
    """
    start = time.perf_counter()
    result = fn()
    if hasattr(result, "wait"):
        result.wait()
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def _checked_trace_dir(trace_dir: str | os.PathLike[str] | None) -> Path | None:
    if trace_dir is None:
        return None
    path = Path(trace_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(
            f"trace_dir {str(path)!r} is not writable ({exc.strerror or exc}); "
            "pass a directory you can write to, or no trace_dir."
        ) from exc
    return path


class CommProfiler:
    """Profiles communication inside phases, on sampled steps only.

    Profiling costs time (about a second to start the first time, plus
    per-op overhead), so only the steps in ``sample_steps`` are profiled and
    their step metrics carry ``comm/sampled = 1.0``.
    """

    def __init__(
        self,
        device_type: str,
        sample_steps: Iterable[int],
        trace_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Args:
        device_type: ``"cuda"`` reads NCCL kernels; anything else measures gloo waits.
        sample_steps: step indices to profile (as passed to ``start_step``).
        trace_dir: where to write one Chrome trace per profiled phase; created if
            missing. Raises ValueError if it cannot be written.
        """
        self.device_type = torch.device(device_type).type
        self.method = "cuda_kernels" if self.device_type == "cuda" else "cpu_gloo"
        self.sample_steps = frozenset(sample_steps)
        self.trace_dir = _checked_trace_dir(trace_dir)
        self._step: int | None = None
        self._metrics: dict[str, float] = {}
        self._active = False

    def start_step(self, step: int) -> None:
        """Begin step ``step``; phases are profiled if it is in ``sample_steps``."""
        self._step = step
        self._metrics = {}

    def end_step(self) -> dict[str, float]:
        """Comm metrics of the step (empty when the step was not sampled)."""
        metrics, self._metrics = self._metrics, {}
        if self._step in self.sample_steps:
            metrics["comm/sampled"] = 1.0
        self._step = None
        return metrics

    def summary(self) -> dict[str, Any]:
        """Run-level facts: which method measured and which steps were sampled."""
        return {"comm/method": self.method, "comm/sample_steps": sorted(self.sample_steps)}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Profile the body when the current step is sampled (nested phases are not)."""
        if self._active or self._step not in self.sample_steps:
            yield
            return
        activities = [ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._active = True
        try:
            with profile(activities=activities, record_shapes=True) as prof:
                yield
        finally:
            self._active = False
        self._record(name, prof)

    def _record(self, name: str, prof: profile) -> None:
        events = list(prof.events())
        if self.method == "cuda_kernels":
            found = device_comm_metrics(events, name)
        else:
            found = host_comm_metrics(events, name)
        nbytes = _collective_bytes(events)
        if nbytes is not None:
            found[f"comm/bytes/{name}"] = nbytes
        for key, value in found.items():
            self._metrics[key] = self._metrics.get(key, 0.0) + value
        if self.trace_dir is not None:
            prof.export_chrome_trace(str(self._trace_path(name)))

    def _trace_path(self, name: str) -> Path:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        stem = f"step{self._step}_{safe}_rank{rank}"
        path, n = self.trace_dir / f"{stem}.json", 1  # type: ignore[operator]
        while path.exists():
            path, n = self.trace_dir / f"{stem}_{n}.json", n + 1  # type: ignore[operator]
        return path
