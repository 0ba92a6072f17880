"""Pure analysis of torch.profiler events: interval sweeps and comm metrics.

Everything here takes plain ``(start, end)`` tuples or objects shaped like
``torch.autograd.profiler_util.FunctionEvent`` (``name``, ``device_type``,
``device_index``, ``time_range`` in microseconds, ``input_shapes``,
``input_dtypes``), so it is tested on synthetic traces without a GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from torch.autograd import DeviceType

Interval = tuple[float, float]

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


def collective_bytes(events: Iterable[Any]) -> float | None:
    """Input bytes of the recorded collectives, or None when none carried shapes."""
    total, seen = 0, False
    for ev in events:
        if not ev.name.startswith(_COLLECTIVE_PREFIXES):
            continue
        # kineto events carry dtypes; FunctionEvent.input_dtypes (the fallback) is missing before torch 2.13.
        dtypes = getattr(ev, "input_dtypes", None) or []
        for shape, dtype in zip(ev.input_shapes or [], dtypes):
            if shape and dtype in _DTYPE_BYTES:
                total += math.prod(shape) * _DTYPE_BYTES[dtype]
                seen = True
    return float(total) if seen else None


def _is_kernel(event: Any) -> bool:
    """False for memcpy/memset and for record_function ranges mirrored onto the
    GPU timeline (torch emits ``nccl:all_reduce`` there spanning its kernel)."""
    return not (
        getattr(event, "is_user_annotation", False)
        or event.name.startswith(_COLLECTIVE_PREFIXES)
        or _MEMORY_OP.match(event.name)
    )


def device_comm_metrics(events: Iterable[Any], phase: str) -> dict[str, float]:
    """``comm/{total,exposed,wait}_s/<phase>`` from CUDA kernel events.

    Comm and compute kernels are compared per device (memcpy/memset and
    GPU-side user annotations count as neither);
    with several devices in one process the largest value is reported.
    """
    per_device: dict[int, tuple[list[Interval], list[Interval]]] = {}
    for ev in events:
        if ev.device_type != DeviceType.CUDA or not _is_kernel(ev):
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
