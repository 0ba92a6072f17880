"""A full run is priced with a cold start's one-time cost: a probe that found its compiled graphs warm never prices
its run cheaper than a cold probe of the same start (or than a stated start-up)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tunekit.config import load_recipe
from tunekit.estimate import cold_start
from tunekit.estimate.cost import one_time_s, project_probe
from tunekit.estimate.profiles import load_profile

H200 = load_profile("h200")


def _project(first_step: float, wall_s: float, **kw):
    steps = pd.DataFrame({"timing_s/step": [first_step, 2.0, 2.0, 2.0]})
    return project_probe(steps, wall_s=wall_s, startup_s=5.0, warmup_steps=1, target_steps=100, gpus_held=1,
                         profile=H200, **kw)


def test_a_run_priced_with_another_one_time_cost_pays_it_once_over_the_same_steps() -> None:
    # 30 s of wall outside the 16 s of steps: fixed 14 s, a 10 s first step, 99 more steps at 2 s
    own = _project(10.0, wall_s=30.0)
    assert own.wall_s == pytest.approx(14 + 10 + 99 * 2)
    assert one_time_s(own, 100) == pytest.approx(14 + 10 - 2)
    cold = _project(10.0, wall_s=30.0, overhead_s=150.0)
    assert cold.wall_s == pytest.approx(150 + 100 * 2) and cold.mean_step_s == own.mean_step_s
    assert cold.yuan / own.yuan == pytest.approx(cold.wall_s / own.wall_s)
    assert cold.paid_s + cold.rest_steps * cold.mean_step_s == pytest.approx(cold.wall_s)


def _summary(runs, name: str, key: str, cache: str | None, own: float) -> None:
    (runs / name).mkdir(parents=True)
    s = {cold_start.START_KEY: key, cold_start.OWN: own} | ({"compile_cache/inductor": cache} if cache else {})
    (runs / name / "summary.json").write_text(json.dumps(s))


def test_a_warm_probe_is_priced_with_the_cold_probe_of_its_start(tmp_path) -> None:
    r, runs = load_recipe(None), tmp_path / "runs"
    _summary(runs, "P00", "A", "miss", own=180.0)    # compiled the graphs: a cold start
    _summary(runs, "P01", "B", "miss", own=400.0)    # another start: it says nothing of these
    _summary(runs, "P02", "A", "partial", own=90.0)  # found some graphs: not a cold start to lend
    (runs / "P03").mkdir()
    assert cold_start.priced_overhead(r, runs / "P03", "A", 40.0) == (180.0, "cold probe P00")
    assert cold_start.priced_overhead(r, runs / "P03", "C", 40.0) == (40.0, "own")  # no cold probe of C here
    assert cold_start.priced_overhead(r, runs / "P00", "A", 180.0) == (180.0, "own")  # the cold probe itself
    stated = load_recipe(None, ["run.startup_s=300"])
    assert cold_start.priced_overhead(stated, runs / "P03", "A", 40.0) == (300.0, "stated (run.startup_s)")


RESOLVED = {"resolved/compile": True, "resolved/cuda_graphs": True}
# what a search varies: learning knobs, the micro-batch, the CUDA-graph replay, the engine's batch and memory knobs
LEARNING = ["probe.seed=7", "algorithm.actor_lr=1e-5"]
SYSTEMS = [["system.batch.micro_batch_size=8"], ["system.rollout.max_num_seqs=64"],
           ["system.rollout.gpu_memory_utilization=0.5"]]


def _keys(sets: list[str], resolved: dict = RESOLVED) -> tuple[str, str]:
    recipe = load_recipe(None, sets)
    return cold_start.start_key(recipe, resolved), cold_start.graphs_key(recipe, resolved)


def test_probes_share_a_start_where_their_cold_starts_do_the_same_work() -> None:
    start, _ = _keys([])
    assert _keys(LEARNING)[0] == start
    assert all(_keys(sets)[0] == start for sets in SYSTEMS)
    assert _keys([], RESOLVED | {"resolved/cuda_graphs": False})[0] == start  # the replay's capture: a second
    # an uncompiled trainer, another runner, another engine compile mode: another start
    assert _keys([], RESOLVED | {"resolved/compile": False})[0] != start
    assert _keys(["runner=trl"])[0] != start
    assert _keys(["system.rollout.enforce_eager=false"])[0] != start


def test_probes_share_compiled_graphs_only_where_they_load_the_same() -> None:
    _, graphs = _keys([])
    assert _keys(LEARNING)[1] == graphs
    # the builtin trainer's graphs take any micro-batch; TRL's compiled model traces each batch size
    assert _keys(["system.batch.micro_batch_size=8"])[1] == graphs
    assert _keys(["runner=trl"])[1] != _keys(["runner=trl", "system.batch.micro_batch_size=8"])[1]
    assert _keys(["system.rollout.gpu_memory_utilization=0.5"])[1] == graphs  # not in vLLM's compile cache key
    assert _keys(["system.rollout.max_num_seqs=64"])[1] != graphs  # the engine's CUDA-graph sizes
    assert _keys([], RESOLVED | {"resolved/cuda_graphs": False})[1] != graphs
