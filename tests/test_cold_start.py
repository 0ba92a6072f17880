"""A full run is priced with a cold start's one-time cost: a probe that found its compiled graphs warm never prices
its run cheaper than the probe of the same shapes that compiled them (or than a stated start-up)."""

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
    s = {cold_start.SHAPE_KEY: key, cold_start.OWN: own} | ({"compile_cache/inductor": cache} if cache else {})
    (runs / name / "summary.json").write_text(json.dumps(s))


def test_a_warm_probe_is_priced_with_the_cold_probe_of_its_shapes(tmp_path) -> None:
    r, runs = load_recipe(None), tmp_path / "runs"
    _summary(runs, "P00", "A", "miss", own=180.0)    # compiled the graphs: a cold start
    _summary(runs, "P01", "B", "miss", own=400.0)    # other shapes: its start says nothing of these
    _summary(runs, "P02", "A", "partial", own=90.0)  # found some graphs: not a cold start to lend
    (runs / "P03").mkdir()
    assert cold_start.priced_overhead(r, runs / "P03", "A", 40.0) == (180.0, "cold probe P00")
    assert cold_start.priced_overhead(r, runs / "P03", "C", 40.0) == (40.0, "own")  # no cold probe of C here
    assert cold_start.priced_overhead(r, runs / "P00", "A", 180.0) == (180.0, "own")  # the cold probe itself
    stated = load_recipe(None, ["run.startup_s=300"])
    assert cold_start.priced_overhead(stated, runs / "P03", "A", 40.0) == (300.0, "stated (run.startup_s)")


def test_probes_share_a_shape_key_only_where_their_graphs_are_alike() -> None:
    summary = {"resolved/compile": True, "resolved/cuda_graphs": True}
    key = cold_start.shape_key(load_recipe(None), summary)
    assert cold_start.shape_key(load_recipe(None, ["probe.seed=7", "algorithm.actor_lr=1e-5"]), summary) == key
    assert cold_start.shape_key(load_recipe(None, ["system.batch.micro_batch_size=8"]), summary) != key
    assert cold_start.shape_key(load_recipe(None), summary | {"resolved/cuda_graphs": False}) != key
