"""A full run is priced with a cold start's one-time cost: a probe that found its compiled graphs warm never prices
its run cheaper than a cold probe of the same start (or than a stated start-up)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tunekit import rundir
from tunekit.config import load_recipe
from tunekit.estimate import cold_start
from tunekit.estimate.cost import one_time_s, project_probe
from tunekit.estimate.profiles import load_profile
from tunekit.metrics import MACHINE
from tunekit.profiler.machine import machine_id
from tunekit.runners import runner_for

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


def _summary(runs, name: str, key: str, cache: str | None, own: float, machine: str | None = None) -> None:
    (runs / name).mkdir(parents=True)
    s = {cold_start.START_KEY: key, cold_start.OWN: own} | ({"compile_cache/inductor": cache} if cache else {})
    s |= {MACHINE: machine} if machine else {}
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


def test_a_cold_start_prices_only_the_warm_probes_of_its_own_machine(tmp_path) -> None:
    """A study resumed on another machine: that machine's cold probe started slower than the first machine's warm
    ones would have started cold, so it prices only the warm probes of its own machine."""
    r, runs = load_recipe(None), tmp_path / "runs"
    _summary(runs, "P00", "A", "miss", own=60.0, machine="first")
    _summary(runs, "P01", "A", "miss", own=140.0, machine="second")  # the same start, cold, on a slower machine
    (runs / "P02").mkdir()
    assert cold_start.priced_overhead(r, runs / "P02", "A", 40.0, "first") == (60.0, "cold probe P00")
    assert cold_start.priced_overhead(r, runs / "P02", "A", 40.0, "second") == (140.0, "cold probe P01")
    assert cold_start.priced_overhead(r, runs / "P02", "A", 40.0, "third") == (40.0, "own")
    assert cold_start.priced_overhead(r, runs / "P02", "A", 40.0) == (40.0, "own")  # no machine: only the unnamed


def test_the_machine_is_the_host_and_its_gpus(monkeypatch) -> None:
    from tunekit.profiler import machine

    monkeypatch.setattr(machine, "gpu_uuids", lambda: ["GPU-b", "GPU-a"])
    two = machine.machine_id()
    monkeypatch.setattr(machine, "gpu_uuids", lambda: ["GPU-a", "GPU-b"])
    assert machine.machine_id() == two  # the order NVML lists them in does not matter
    monkeypatch.setattr(machine, "gpu_uuids", lambda: ["GPU-a", "GPU-c"])
    assert machine.machine_id() != two  # another GPU in the same host: another machine
    monkeypatch.setattr(machine.socket, "gethostname", lambda: "elsewhere")
    monkeypatch.setattr(machine, "gpu_uuids", lambda: ["GPU-a", "GPU-b"])
    assert machine.machine_id() != two and len(two) == 12

    def unnamed():
        raise RuntimeError("NVML cannot read a GPU's UUID")

    monkeypatch.setattr(machine, "gpu_uuids", unnamed)
    assert machine.machine_id() == machine.machine_id() != two  # the host alone, never a failed probe


RESOLVED = {"resolved/compile": True, "resolved/cuda_graphs": True}
# what a search varies: learning knobs, the micro-batch, the CUDA-graph replay, the engine's batch and memory knobs
LEARNING = ["probe.seed=7", "algorithm.actor_lr=1e-5"]
SYSTEMS = [["system.batch.micro_batch_size=8"], ["system.rollout.max_num_seqs=64"],
           ["system.rollout.gpu_memory_utilization=0.5"]]


def _keys(sets: list[str], resolved: dict = RESOLVED) -> tuple[str, str]:
    recipe = load_recipe(None, sets)
    traits = runner_for(recipe).traits
    return cold_start.start_key(recipe, resolved), cold_start.graphs_key(recipe, resolved, traits=traits)


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


# A probe stopped before its end (a search's stop, a kill at its timeout) leaves its start in startup.json and its
# steps; a cold one still prices the warm probes of its start.
STOPPED = ["probe.warmup_steps=3"]


def _stopped(runs, name: str, key: str, startup: str, steps: list[float]) -> None:
    """A probe the search abandoned: the launcher's running summary (its start key), its first step's startup.json
    (``startup``: the file's text) and the steps it finished, as steps.jsonl."""
    run = runs / name
    run.mkdir(parents=True)
    rundir.write_config(run, load_recipe(None, STOPPED))
    rundir.write_summary(run, {"status": "failed", "reason": "abandoned: the search stopped", cold_start.START_KEY: key})
    (run / rundir.STARTUP).write_text(startup)
    (run / rundir.STEPS_LIVE).write_text("".join(json.dumps({"step": i, "timing_s/step": t}) + "\n"
                                                 for i, t in enumerate(steps)))


def test_where_the_compiling_ran_outside_the_recording_process_the_launchers_word_decides(tmp_path) -> None:
    """A single controller's driver (or a vLLM server's probe) compiles nothing itself and has no cache verdict:
    the launcher's word on its shapes (new, or compiled by an earlier probe) says whether it started cold."""
    r, runs = load_recipe(None), tmp_path / "runs"
    for name, shapes, own in (("P00", "new", 82.0), ("P01", "compiled", 39.4)):
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(json.dumps({cold_start.START_KEY: "A", cold_start.OWN: own,
                                                               cold_start.SHAPES: shapes}))
    assert cold_start.priced_overhead(r, runs / "P01", "A", 39.4) == (82.0, "cold probe P00")
    assert cold_start.cache_reading({cold_start.SHAPES: "compiled"}) == "hit"
    assert cold_start.cache_reading({cold_start.SHAPES: "new", "compile_cache/inductor": "hit"}) == "hit"  # its own
    assert cold_start.cache_reading({}) is None
    # priced with its own one-time cost though it started warm: flagged, as a probe with its own verdict is
    assert cold_start.warm_priced({cold_start.SOURCE: "own", cold_start.SHAPES: "compiled"})
    assert not cold_start.warm_priced({cold_start.SOURCE: "own", cold_start.SHAPES: "new"})


COLD_START = json.dumps({"startup_s": 60.0, "compile_cache/inductor": "miss", "first_step/step_s": 30.0})
# a 30 s first step, two more warm-up steps at 20 s, then 5 s steps: the first step's excess is 25 s
COLD_STEPS = [30.0, 20.0, 20.0, 5.0, 5.0]


def test_a_cold_probe_stopped_part_way_prices_the_warm_probes_of_its_start(tmp_path) -> None:
    r, runs = load_recipe(None), tmp_path / "runs"
    _stopped(runs, "P00", "A", COLD_START, COLD_STEPS)
    _summary(runs, "P01", "A", "hit", own=40.0)  # its retry, finished warm
    # 60 s of start-up and the first step's 25 s over the steps past the three warm-up ones; no teardown
    assert cold_start.priced_overhead(r, runs / "P01", "A", 40.0) == (85.0, "cold probe P00")
    assert cold_start.priced_overhead(r, runs / "P01", "B", 40.0) == (40.0, "own")  # another start: not its
    assert cold_start.priced_overhead(r, runs / "P01", "A", 90.0) == (90.0, "own")  # its own is larger
    warm = json.dumps({"startup_s": 60.0, "compile_cache/inductor": "hit"})
    _stopped(runs / "warm", "P00", "A", warm, COLD_STEPS)  # found the cache warm: no cold start to lend
    (runs / "warm" / "P01").mkdir()
    assert cold_start.priced_overhead(r, runs / "warm" / "P01", "A", 40.0) == (40.0, "own")


@pytest.mark.parametrize("startup", ["", '{"startup_s": 60.0, "compile_cache/ind', "[1, 2]", '{"startup_s": "soon", "compile_cache/inductor": "miss"}'])
def test_an_unreadable_startup_record_is_skipped(tmp_path, startup) -> None:
    runs = tmp_path / "runs"
    _stopped(runs, "P00", "A", startup, COLD_STEPS)
    (runs / "P01").mkdir()
    assert cold_start.priced_overhead(load_recipe(None), runs / "P01", "A", 40.0) == (40.0, "own")


def test_a_cold_probe_whose_steps_are_unreadable_lends_its_start_up_alone(tmp_path) -> None:
    runs = tmp_path / "runs"
    _stopped(runs, "P00", "A", COLD_START, [])
    (runs / "P00" / rundir.STEPS).write_bytes(b"PAR1 half written")
    (runs / "P01").mkdir()
    assert cold_start.priced_overhead(load_recipe(None), runs / "P01", "A", 40.0) == (60.0, "cold probe P00")


def test_a_probe_killed_before_its_result_is_summed_up_with_its_start(tmp_path) -> None:
    """Killed at its timeout after four steps, before its result.json and before its reward reached the threshold
    (the run's length unknown): its summary has the start-up and cache verdict of its startup.json, and its own
    one-time cost over the steps it ran, which then prices a warm probe of its start."""
    from tunekit.launch.probe import probe_start_key, summarize

    r = load_recipe(None, ["system.device=cpu", "probe.warmup_steps=1", "run.until=threshold",
                           "search.reward_threshold=0.9"])
    run = tmp_path / "runs" / "P00"
    run.mkdir(parents=True)
    rundir.write_config(run, r)
    (run / rundir.STARTUP).write_text(COLD_START)
    (run / rundir.STEPS_LIVE).write_text("".join(json.dumps({"step": i, "timing_s/step": t, "reward/mean": 0.1}) + "\n"
                                                 for i, t in enumerate([30.0, 5.0, 5.0, 5.0])))
    s = summarize(r, run, "timeout", "killed", 120.0, load_profile("cpu"))
    assert (s["startup_s"], s["compile_cache/inductor"]) == (60.0, "miss")
    assert s["steady"]["timing_s/step"] == 5.0 and "cost/target_steps" not in s
    assert s["first_step/excess_s"] == pytest.approx(25.0)  # its 30 s first step over the steady 5 s
    # 120 s of wall less 45 s of steps: 75 s outside them; and the first step's 25 s over the steady 5 s
    assert s[cold_start.OWN] == pytest.approx(100.0)
    assert s[cold_start.START_KEY] == probe_start_key(r, gpu=False) and s[MACHINE] == machine_id()
    rundir.write_summary(run, s)
    (tmp_path / "runs" / "P01").mkdir()
    assert cold_start.priced_overhead(r, tmp_path / "runs" / "P01", s[cold_start.START_KEY], 40.0, machine_id()) == (
        pytest.approx(100.0), "cold probe P00")


def test_the_first_step_leaves_the_start_up_in_the_run_directory(tmp_path, monkeypatch) -> None:
    import time

    from torch._dynamo.utils import counters

    from tunekit.profiler.startup import LAUNCHED_AT_ENV, StartupClock

    monkeypatch.setenv(LAUNCHED_AT_ENV, repr(time.time() - 5.0))  # launched 5 s before this process began
    for group, hit, miss in (("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss"),
                             ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss")):
        monkeypatch.setitem(counters[group], hit, 0)
        monkeypatch.setitem(counters[group], miss, 1)  # every graph compiled here: a cold start
    monkeypatch.delenv(rundir.RUN_DIR_ENV, raising=False)
    clock = StartupClock()
    clock.steps_begin()
    clock.first_step_done({"timing_s/step": 3.0})
    assert not (tmp_path / rundir.STARTUP).exists() and rundir.read_startup(tmp_path) is None  # no run dir: nothing
    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(tmp_path))
    clock.first_step_done()  # a rank that records nothing
    assert rundir.read_startup(tmp_path) is None
    clock.first_step_done({"timing_s/step": 3.0})
    record = rundir.read_startup(tmp_path)
    assert 5.0 <= record["startup_s"] < 6.0 and record["first_step/step_s"] == 3.0
    assert (record["compile_cache/inductor"], record["compile_cache/misses"]) == ("miss", 2)
    assert "first_step/excess_s" not in record  # no steady step yet
