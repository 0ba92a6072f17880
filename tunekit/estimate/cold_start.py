"""The one-time cost a full run is priced with: a cold start's, whatever caches the probe found warm.

A probe's own one-time cost (:func:`tunekit.estimate.cost.one_time_s`: start-up, teardown, the warm-up steps' excess
over the steady step) shrinks once an earlier probe has left its compiled graphs (or some of them) and its engine's
in the output directory's caches, but the full run starts cold once. So every run is priced with the one-time cost of
a cold start: ``run.startup_s`` when the recipe states it; else the largest cold one-time cost (:func:`cold_one_time_s`)
of another probe of the same start (:func:`start_key`: the same model, runner, training path and engine compile knobs)
in the same output directory and on the same machine (:data:`~tunekit.metrics.MACHINE`: two machines of one
GPU kind may start at different speeds), when that is larger than the probe's own; else the probe's own. A probe
whose compile cache missed (it compiled cold) lends its own one-time cost; one that never wrote it (stopped by a
search part-way, killed, still running) lends what its first step left in ``startup.json``, so a cold start that
ended early still prices the warm probes after it. The launcher decides it once per probe and writes it into
``summary.json`` (:data:`PRICED`); whoever projects the run later reads it there. The start key and the machine are in
the summary from the launch on.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from tunekit import metrics
from tunekit.config import Recipe
from tunekit.config.errors import TunekitError
from tunekit.estimate.traits import RunnerTraits
from tunekit.metrics import MACHINE
from tunekit.rundir import SUMMARY, read_config, read_startup, read_steps

START_KEY = "startup/start_key"
"""A digest of what decides the work of a probe's cold start (:func:`start_key`)."""
OWN = "cost/own_overhead_s"
"""The probe's own one-time cost, as its run would pay it."""
PRICED = "cost/priced_overhead_s"
"""The one-time cost its run is priced with."""
SOURCE = "cost/overhead_source"
"""Where :data:`PRICED` came from: ``own``, ``stated (run.startup_s)`` or the cold probe's run directory."""
COLD = "miss"
"""``compile_cache/inductor`` of a probe that compiled its graphs itself."""
VERDICT = "compile_cache/inductor"
VLLM_VERDICT = "compile_cache/vllm"
SHAPES = "compile_cache/shapes"
"""The launcher's word on a probe's shapes (its graphs key) in the shared compile cache at its launch: ``compiled``
by an earlier probe, or ``new``."""


def cache_reading(summary: dict[str, Any]) -> str | None:
    """Whether a probe's caches answered (``hit``, ``partial``, ``miss``): Inductor's verdict where the process that
    records the probe compiled (:data:`VERDICT`) with vLLM's engines' (:data:`VLLM_VERDICT`), ``partial`` where they
    differ; without either, where the compiling ran in other processes (a single controller's role workers), the
    launcher's word: ``miss`` for shapes no earlier probe had compiled into the shared cache (:data:`SHAPES`
    ``new``), ``hit`` for ones one had; None where nothing says."""
    verdicts = {summary.get(k) for k in (VERDICT, VLLM_VERDICT)} & {"hit", "partial", COLD}
    if verdicts:
        return verdicts.pop() if len(verdicts) == 1 else "partial"
    return {"new": COLD, "compiled": "hit"}.get(summary.get(SHAPES))


def _start_parts(recipe: Recipe, resolved: dict[str, Any]) -> dict[str, Any]:
    rc = recipe.system.rollout
    return {"model": recipe.model.model_dump(mode="json"), "runner": recipe.runner,
            "resolved": {k: v for k, v in resolved.items() if k.startswith("resolved/") and k != "resolved/cuda_graphs"},
            "max_new_tokens": recipe.task.max_new_tokens, "rollout": [rc.backend, rc.enforce_eager, rc.torch_compile]}


def _digest(parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def start_key(recipe: Recipe, summary: dict[str, Any]) -> str:
    """What two probes must share for one's cold start to price the other's run: the model, the runner, what the
    training path resolved to (``resolved/*`` in ``summary``: sharded or not, compiled or not, master weights), the
    response length and the rollout engine's compile knobs. Not what changes which graphs a cache holds more than
    what compiling them costs: the micro-batch, the CUDA-graph replay (its capture takes a second or less), the
    graphs' width rounding and the engine's batch and memory knobs (:func:`graphs_key` has them)."""
    return _digest(_start_parts(recipe, summary))


def graphs_key(recipe: Recipe, resolved: dict[str, Any], *, traits: RunnerTraits) -> str:
    """What two probes must share for one to load exactly the graphs the other compiled: :func:`start_key`'s parts,
    the CUDA-graph replay, the graphs' width rounding, the micro-batch unless the runner's graphs take any batch size
    (``traits``: :attr:`~tunekit.estimate.traits.RunnerTraits.graphs_any_batch`) and every rollout knob but
    ``gpu_memory_utilization``, which vLLM leaves out of its compile cache's key (``max_num_seqs`` sets the engine's
    CUDA-graph sizes, and so that key). Known before the launch from the runner's ``training_path``, for a probe
    that starts only where an earlier one compiled exactly what it will load."""
    sysc = recipe.system
    return _digest([_start_parts(recipe, resolved), resolved.get("resolved/cuda_graphs"), sysc.graph_width_multiple,
                    None if traits.graphs_any_batch else sysc.batch.micro_batch,
                    sysc.rollout.model_dump(mode="json", exclude={"gpu_memory_utilization"})])


def cold_one_time_s(run_dir: Path, summary: dict[str, Any]) -> float | None:
    """The one-time cost of the probe in ``run_dir`` (its summary: ``summary``) where it started cold, else None.

    A probe whose summary has its own one-time cost (:data:`OWN`) started cold where its compile cache missed
    (:func:`cache_reading` is :data:`COLD`), and its cost is that. One without it (stopped part-way by a search,
    killed before its launcher summed it up, still running) started cold where its ``startup.json`` says the cache
    missed, and its cost is its start-up (``startup_s``) plus its first step's excess (:func:`first_step_excess_s`).
    Such a probe never tore down, so no teardown is in it. An unreadable startup.json says nothing: None."""
    try:
        if summary.get(OWN) is not None:
            return float(summary[OWN]) if cache_reading(summary) == COLD else None
        started = read_startup(run_dir)
        if started is None or cache_reading({SHAPES: summary.get(SHAPES)} | started) != COLD:
            return None
        return float(started["startup_s"]) + first_step_excess_s(run_dir)
    except (TypeError, ValueError, KeyError):  # a record with other keys or values than a probe writes
        return None


def first_step_excess_s(run_dir: Path) -> float:
    """How much longer the first step of the probe in ``run_dir`` took than the median of its steps past its warm-up
    (``probe.warmup_steps``, at least the first step), from the steps it has written so far; 0 where it finished no
    such step or its steps or config are unreadable (a file half-written or corrupt)."""
    try:
        steps, warm = read_steps(run_dir), read_config(run_dir).probe.warmup_steps
        times = [float(t) for t in steps[metrics.TIMING_STEP].dropna()] if metrics.TIMING_STEP in steps else []
    except (OSError, ValueError, TypeError, yaml.YAMLError, TunekitError):
        return 0.0
    later = times[max(warm, 1):]
    return max(0.0, times[0] - statistics.median(later)) if later else 0.0


def warm_priced(summary: dict[str, Any]) -> bool:
    """Whether a probe's run is priced with its own one-time cost though its compile cache answered (``hit`` or
    ``partial``): no cold start of its start was measured in its output directory, so its price leaves out compile
    work that a real run pays once, and reads cheaper than it is."""
    return summary.get(SOURCE) == "own" and cache_reading(summary) in ("hit", "partial")


def priced_overhead(recipe: Recipe, run_dir: Path, key: str, own_s: float,
                    machine: str | None = None) -> tuple[float, str]:
    """(one-time cost to price the run with, where it came from) for the probe in ``run_dir`` of start ``key``
    (:func:`start_key`) on ``machine`` (:func:`tunekit.profiler.machine.machine_id`) whose own one-time cost is
    ``own_s``: the rule of this module's docstring, read from the other probes of its output directory
    (:func:`cold_one_time_s`). Probes that recorded no machine (older summaries) match one another."""
    if recipe.run.startup_s is not None:
        return recipe.run.startup_s, "stated (run.startup_s)"
    best, source = own_s, "own"
    here = Path(run_dir).resolve()
    for other in sorted(here.parent.glob(f"*/{SUMMARY}")):
        if other.parent == here:
            continue
        try:
            s = json.loads(other.read_text())
        except (OSError, ValueError):  # a summary being written, or not one
            continue
        if not isinstance(s, dict) or s.get(START_KEY) != key or s.get(MACHINE) != machine:
            continue
        cold = cold_one_time_s(other.parent, s)
        if cold is not None and cold > best:
            best, source = cold, f"cold probe {other.parent.name}"
    return best, source
