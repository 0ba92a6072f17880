"""Where a probe's fixed cost goes: launch to the first step, and the first step's excess over a steady one.

The launcher stamps the launch time into the probe's environment (:data:`LAUNCHED_AT_ENV`); a probe's main process
opens a :class:`StartupClock`, times its start-up parts with :meth:`StartupClock.part` (model load, engine start)
or records those read off a framework's output with :meth:`StartupClock.record` (verl's:
:mod:`tunekit.runners.verl_startup`), and hands it the steps when they are done; the process that records the
probe also writes these keys into the run directory's startup.json as its first step ends, so that a probe stopped
before its result still says how it started. torch's compile counters say how much of the first step was compile
(Dynamo's trace, AOTAutograd, Inductor: ``torch._dynamo.utils.calculate_time_spent``) and CUDA-graph capture
(CUDA Graph Trees' ``CUDAGraphNode.record``), and whether Inductor's caches answered (``fxgraph_cache_hit`` /
``autograd_cache_hit``). Keys written (seconds unless said):

- ``startup_s``: launch (or, without the stamp, this process's start) to the first step;
- ``startup/launch_s``: launch to this process's start of work (interpreter, imports, torchrun);
- ``startup/<part>_s``: each timed part (``imports``, ``setup``, ``model_load``, ``engine_start``, ``eval_before``
  ...), and ``startup/other_s`` the rest (the profiler's start, the trainer's);
- ``eval/reward_before``: the held-out reward of the evaluation before the first step, where one ran
  (``probe.eval_before_train``);
- ``first_step/step_s``, ``first_step/excess_s`` (over the steady median ``timing_s/step``);
- ``first_step/compile_s``, ``first_step/graph_capture_s``: torch's compile and capture inside the first step;
- ``compile/total_s``, ``compile/graph_capture_s``, ``compile/graph_captures``: the same over the whole probe;
  ``compile/total_s`` split into ``compile/dynamo_s`` (Dynamo's bytecode trace and guards: paid in every process,
  no cache skips it) and ``compile/backend_s`` (AOTAutograd and Inductor, or their loads from the cache), and
  ``compile/graphs`` the graphs Dynamo traced; these only where this process compiled (a single controller's
  driver leaves compiling to its workers);
- ``compile_cache/inductor``: ``hit`` (every lookup answered), ``miss`` (none), ``partial``, or absent when
  nothing compiled; ``compile_cache/hits`` and ``compile_cache/misses`` count the lookups.

The launcher adds vLLM's own compile cache, read off the engine's output (:func:`vllm_cache_fields`):
``compile_cache/vllm`` (hit, miss, partial, or ``disabled``) with ``compile_cache/vllm_hits`` and ``_misses``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunekit import rundir
from tunekit.metrics import EVAL_REWARD_BEFORE, TIMING_STEP

LAUNCHED_AT_ENV = "TUNEKIT_LAUNCHED_AT"
"""Set by the launcher to the launch time (``time.time()``, seconds since the epoch) in every process of a probe."""
CAPTURE_KEY = "CUDAGraphNode.record"
"""torch's timing key (``torch._dynamo.utils.compile_times``) of one CUDA graph's capture."""


def launch_stamp() -> dict[str, str]:
    """The environment entry that lets a probe measure its start-up from its launch."""
    return {LAUNCHED_AT_ENV: repr(time.time())}


def compile_counters() -> dict[str, float]:
    """torch's compile counters in this process so far: compile seconds, capture seconds and count, cache
    lookups. Zero where torch compiled nothing."""
    from torch._dynamo.utils import calculate_time_spent, compilation_time_metrics, counters

    captures = compilation_time_metrics.get(CAPTURE_KEY, [])
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    phases = calculate_time_spent()
    backend = phases.get("backend_compile", 0.0) + phases.get("entire_backward_compile", 0.0)
    return {"compile_s": float(phases.get("total_wall_time", 0.0)), "backend_s": float(backend),
            "dynamo_s": float(max(0.0, phases.get("entire_frame_compile", 0.0) - phases.get("backend_compile", 0.0))),
            "graphs": float(counters["stats"]["unique_graphs"]),
            "graph_capture_s": float(sum(captures)), "graph_captures": float(len(captures)),
            "hits": float(inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"]),
            "misses": float(inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"])}


def compile_time_table(top: int = 12) -> str:
    """torch's own timing of its compile pipeline in this process (``compilation_time_metrics``: Dynamo, AOTAutograd,
    Inductor, cache loads, kernel loads, CUDA-graph capture), the ``top`` largest totals as one line each, for the
    probe's log: where a warm start's seconds go when every cache lookup hit. Empty where nothing compiled."""
    from torch._dynamo.utils import compilation_time_metrics

    totals = sorted(((sum(v), len(v), k) for k, v in compilation_time_metrics.items() if v), reverse=True)
    return "\n".join(f"compile time {k}: {s:.2f} s in {n} call(s)" for s, n, k in totals[:top])


def cache_verdict(hits: float, misses: float) -> str | None:
    """``hit`` when every cache lookup answered, ``miss`` when none did, ``partial`` between; None without lookups."""
    if hits + misses == 0:
        return None
    return "hit" if not misses else "miss" if not hits else "partial"


VLLM_HITS = ("Directly load the compiled graph(s)", "Directly load AOT compilation")
"""vLLM's (0.25) lines when its engine loads a compiled graph, or its whole compiled forward, from its cache."""
VLLM_MISSES = ("Compiling a graph for compile range",)
"""vLLM's line when its engine compiles a graph it did not find in its cache."""
VLLM_DISABLED = "vLLM's torch.compile cache is disabled"


def vllm_cache_fields(lines: list[str]) -> dict[str, Any]:
    """Whether the vLLM engines' compile caches answered, from their output ``lines`` (each engine logs each of its
    graphs' load or compile once): ``compile_cache/vllm`` (:func:`cache_verdict`, or ``disabled`` where the engine
    ran with its cache off, as verl's servers do) and the counts; empty where no engine compiled."""
    if any(VLLM_DISABLED in line for line in lines):
        return {"compile_cache/vllm": "disabled"}
    hits = sum(any(h in line for h in VLLM_HITS) for line in lines)
    misses = sum(any(m in line for m in VLLM_MISSES) for line in lines)
    verdict = cache_verdict(hits, misses)
    return {} if verdict is None else {"compile_cache/vllm": verdict, "compile_cache/vllm_hits": hits,
                                       "compile_cache/vllm_misses": misses}


class StartupClock:
    """Times one probe process's start-up and reads its first step against the steady ones."""

    def __init__(self, started: float | None = None) -> None:
        """``started``: when this process began its work (``time.time()``); default now."""
        self.started = time.time() if started is None else started
        stamp = os.environ.get(LAUNCHED_AT_ENV)
        self.launched = float(stamp) if stamp else self.started
        self.parts: dict[str, float] = {}
        self.first_ready: float | None = None
        self.reward_before: float | None = None
        """The held-out reward of the evaluation before the first step (:meth:`evaluated_before`)."""
        self._before_first: dict[str, float] = {}
        self._after_first: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Adds the block's wall seconds to ``startup/<name>_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - start

    def record(self, name: str, seconds: float) -> None:
        """``startup/<name>_s`` measured elsewhere (e.g. read off a framework's output): ``seconds``."""
        self.parts[name] = seconds

    def evaluated_before(self, reward: float | None) -> None:
        """The evaluation before the first step gave ``reward`` (None: it gave none); its seconds are the part
        ``eval_before`` (timed with :meth:`part`, or read off a framework's output with :meth:`record`)."""
        self.reward_before = None if reward is None else float(reward)

    def steps_begin(self, at: float | None = None) -> None:
        """The first step starts now (or at ``at``, a ``time.time()`` reading): start-up ends."""
        self.first_ready = time.time() if at is None else at
        self._before_first = compile_counters()

    def first_step_done(self, row: dict[str, Any] | None = None) -> None:
        """The first step has ended. ``row``: its step row, in the process that records the probe (rank 0, the
        driver); there the start-up as :meth:`summary` reads it now is written to the run directory's startup.json
        (:func:`tunekit.rundir.write_startup`; the directory of :data:`~tunekit.rundir.RUN_DIR_ENV`, nothing
        without it), so a probe stopped before its result still says how it started."""
        self._after_first = compile_counters()
        run_dir = os.environ.get(rundir.RUN_DIR_ENV)
        if row is not None and run_dir:
            rundir.write_startup(Path(run_dir), self.summary([row], {}))

    def summary(self, rows: list[dict[str, Any]], steady: dict[str, float]) -> dict[str, Any]:
        """The keys of this module's docstring, from the probe's per-step rows and its steady medians
        (:func:`~tunekit.profiler.phases.steady_summary`)."""
        ready = self.first_ready if self.first_ready is not None else time.time()
        out: dict[str, Any] = {"startup_s": ready - self.launched,
                               "startup/launch_s": max(0.0, self.started - self.launched)}
        out |= {f"startup/{name}_s": s for name, s in self.parts.items()}
        out["startup/other_s"] = max(0.0, out["startup_s"] - out["startup/launch_s"] - sum(self.parts.values()))
        if self.reward_before is not None:
            out[EVAL_REWARD_BEFORE] = self.reward_before
        end = compile_counters()
        first = {k: self._after_first.get(k, 0.0) - self._before_first.get(k, 0.0) for k in end}
        if end["compile_s"] > 0:  # this process compiled (a driver whose workers compile measures nothing here)
            out |= {"compile/total_s": end["compile_s"], "compile/dynamo_s": end["dynamo_s"],
                    "compile/backend_s": end["backend_s"], "compile/graphs": int(end["graphs"]),
                    "compile/graph_capture_s": end["graph_capture_s"], "compile/graph_captures": int(end["graph_captures"]),
                    "first_step/compile_s": first["compile_s"], "first_step/graph_capture_s": first["graph_capture_s"]}
        if (verdict := cache_verdict(end["hits"], end["misses"])) is not None:
            out |= {"compile_cache/inductor": verdict, "compile_cache/hits": int(end["hits"]),
                    "compile_cache/misses": int(end["misses"])}
        if rows and TIMING_STEP in rows[0]:
            out["first_step/step_s"] = float(rows[0][TIMING_STEP])
            if TIMING_STEP in steady:
                out["first_step/excess_s"] = out["first_step/step_s"] - steady[TIMING_STEP]
        return out
