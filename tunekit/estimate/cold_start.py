"""The one-time cost a full run is priced with: a cold start's, whatever caches the probe found warm.

A probe's own one-time cost (:func:`tunekit.estimate.cost.one_time_s`: start-up, teardown, the warm-up steps' excess
over the steady step) shrinks once an earlier probe has left its compiled graphs (or some of them) and its engine's
in the output directory's caches, but the full run starts cold once. So every run is priced with the one-time cost of
a cold start: ``run.startup_s`` when the recipe states it; else the largest one-time cost measured by a probe of the
same start (:func:`start_key`: the same model, runner, training path and engine compile knobs) in the same output
directory whose compile cache missed (it compiled cold), when that is larger than the probe's own; else the probe's
own. The launcher decides it once per probe and writes it into ``summary.json`` (:data:`PRICED`); whoever projects
the run later reads it there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tunekit.config import Recipe
from tunekit.rundir import SUMMARY

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


def graphs_key(recipe: Recipe, resolved: dict[str, Any]) -> str:
    """What two probes must share for one to load exactly the graphs the other compiled: :func:`start_key`'s parts,
    the CUDA-graph replay, the graphs' width rounding, the micro-batch for runners other than tunekit's own (whose
    graphs take any batch size, :func:`tunekit.trainer.parallel.dynamic_shapes`) and every rollout knob but
    ``gpu_memory_utilization``, which vLLM leaves out of its compile cache's key (``max_num_seqs`` sets the engine's
    CUDA-graph sizes, and so that key). Known before the launch from the runner's ``training_path``, for a probe
    that starts only where an earlier one compiled exactly what it will load."""
    sysc = recipe.system
    return _digest([_start_parts(recipe, resolved), resolved.get("resolved/cuda_graphs"), sysc.graph_width_multiple,
                    None if recipe.runner == "builtin" else sysc.batch.micro_batch,
                    sysc.rollout.model_dump(mode="json", exclude={"gpu_memory_utilization"})])


def priced_overhead(recipe: Recipe, run_dir: Path, key: str, own_s: float) -> tuple[float, str]:
    """(one-time cost to price the run with, where it came from) for the probe in ``run_dir`` of start ``key``
    (:func:`start_key`) whose own one-time cost is ``own_s``: the rule of this module's docstring, read from the
    summaries of the other probes in its output directory."""
    if recipe.run.startup_s is not None:
        return recipe.run.startup_s, "stated (run.startup_s)"
    best, source = own_s, "own"
    for other in sorted(Path(run_dir).resolve().parent.glob(f"*/{SUMMARY}")):
        if other.parent == Path(run_dir).resolve():
            continue
        try:
            s = json.loads(other.read_text())
        except (OSError, ValueError):  # a summary being written, or not one
            continue
        if s.get(START_KEY) == key and s.get("compile_cache/inductor") == COLD and float(s.get(OWN) or 0) > best:
            best, source = float(s[OWN]), f"cold probe {other.parent.name}"
    return best, source
