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

import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from tunekit.profiler.traces import (
    classify_kernel,
    collective_bytes,
    device_comm_metrics,
    exposed_comm,
    host_comm_metrics,
)

__all__ = ["CommProfiler", "classify_kernel", "exposed_comm", "over_ranks", "per_node", "timed_collective_wait"]

T = TypeVar("T")


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


@dataclass(frozen=True)
class _Span:
    start: float
    end: float


@dataclass(frozen=True)
class _Event:
    """The fields of a ``FunctionEvent`` that :mod:`tunekit.profiler.traces` reads."""

    name: str
    device_type: Any
    device_index: int
    time_range: _Span
    input_shapes: list
    input_dtypes: list
    is_user_annotation: bool


def profiled_events(prof: profile) -> list[Any]:
    """The profiler's raw events, in the shape :mod:`tunekit.profiler.traces` reads.

    ``prof.events()`` builds the whole ``FunctionEvent`` tree first, many times slower
    than reading the kineto results directly. Falls back to ``prof.events()`` where the
    torch build does not expose them.
    """
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is None:
        return list(prof.events())
    return [_Event(e.name(), e.device_type(), e.device_index(), _Span(e.start_ns() / 1e3, e.end_ns() / 1e3),
                   e.shapes(), e.dtypes(), e.is_user_annotation()) for e in raw.events()]


class CommProfiler:
    """Profiles communication inside phases, on sampled steps only.

    Profiling costs time (per-op overhead), so only the steps in
    ``sample_steps`` are profiled and their step metrics carry
    ``comm/sampled = 1.0``. The first profiler start in a process takes about
    a second, and longer on some ranks than others; that skew would show up as
    collective wait on the quicker ranks, so :meth:`start_step` pays it once,
    before the step's collectives, in the step just before the first sample.
    Sample a step after at least one unsampled step to keep it out entirely.
    Not earlier: a CUDA profiler session, even an empty one, leaves CUPTI
    hooked into every later kernel launch (pytorch/pytorch#144455), which slows
    every later step of a launch-bound probe.
    """

    def __init__(
        self,
        device_type: str,
        sample_steps: Iterable[int],
        trace_dir: str | os.PathLike[str] | None = None,
        skip_phases: Iterable[str] = (),
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
        # token-by-token generation launches ~10^5 kernels: profiling it costs minutes, not seconds
        self.skip_phases = frozenset(skip_phases)
        self.trace_dir = _checked_trace_dir(trace_dir)
        self._step: int | None = None
        self._metrics: dict[str, float] = {}
        self._active = False
        self._warm = False

    def start_step(self, step: int) -> None:
        """Begin step ``step``; phases are profiled if it is in ``sample_steps``."""
        self._step = step
        self._metrics = {}
        if not self._warm and self.sample_steps and step >= min(self.sample_steps) - 1:
            with profile(activities=self._activities()):
                pass
            self._warm = True

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
        if self._active or self._step not in self.sample_steps or name in self.skip_phases:
            yield
            return
        self._active = True
        try:
            with profile(activities=self._activities(), record_shapes=True) as prof:
                yield
        finally:
            self._active = False
        self._record(name, prof)

    def _activities(self) -> list[ProfilerActivity]:
        if self.device_type == "cuda":
            return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        return [ProfilerActivity.CPU]

    def _record(self, name: str, prof: profile) -> None:
        events = profiled_events(prof)
        if self.method == "cuda_kernels":
            found = device_comm_metrics(events, name)
        else:
            found = host_comm_metrics(events, name)
        nbytes = collective_bytes(events)
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


def over_ranks(parts: Iterable[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The group's communication on a sampled step, from every rank's ``(node, comm metrics)``: the mean over the
    ranks of each ``comm/<what>`` key, under its own name. One rank's alone would depend on which rank is the
    straggler: the quicker ranks wait for it."""
    return _means(parts, lambda node, what: f"comm/{what}")


def per_node(parts: Iterable[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Each node's communication on a sampled step, from every rank's ``(node, comm metrics)``: the mean over
    the node's ranks of each ``comm/<what>`` key, as ``comm/node<N>/<what>`` (e.g. ``comm/node1/exposed_s/update_actor``
    beside ``comm/node1/total_s/update_actor``)."""
    return _means(parts, lambda node, what: f"comm/node{node}/{what}")


def _means(parts: Iterable[tuple[int, dict[str, float]]], name: Callable[[int, str], str]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for node, metrics in parts:
        for key, value in metrics.items():
            if key.startswith("comm/") and key != "comm/sampled":
                sums.setdefault(name(node, key.removeprefix("comm/")), []).append(float(value))
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}
