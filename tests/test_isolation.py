"""A crash, an OOM or a hang in one rank ends the probe with a status and leaves no process behind.

Each fault (``TUNEKIT_FAULT``, ``tunekit.trainer.faults``) hits the last rank at step 1: under spmd the
second torchrun rank, under the single controller the actor group's last Ray worker.
"""

from __future__ import annotations

import json
import time

import pytest
from probe_procs import ProcessWatch, probe_pids

from tunekit.config import ROLES, load_recipe
from tunekit.launch.probe import run_probe
from tunekit.rundir import STEPS_LIVE, read_steps, steps_done

# GRPO: no critic, one Ray worker fewer to start
SMALL = ["probe.steps=3", "probe.warmup_steps=0", "profiler.comm_steps=0", "system.device=cpu", "algorithm.name=grpo",
         "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2", "system.batch.micro_batch_size=4"]
CONTROLLERS = {
    "spmd2": [f"system.device_map.{r}=[0,1]" for r in ROLES],
    "single": ["system.controller=single"],
}
EXPECTED = {"crash": "failed", "abort": "failed", "oom": "oom", "hang": "timeout"}
# a hang is caught by the stall timeout (no step for 2 s once step 0 is done), whatever startup
# costs on a busy machine; the fault hits step 1, so no step has to finish within it. A crash or an
# OOM must end the probe by itself first: its stall timeout leaves the controller 15 s to notice.
HANG_STALL_S = 2
FAULT_STALL_S = 15


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # ranks and workers start and step faster on 2 shared cores


# Each controller meets a rank killed by a signal, an exception and a hang. A crash (SIGKILL) and an abort (SIGABRT)
# end a rank the same way; spmd takes the abort, whose last words its reason must carry, the single controller the
# crash, which says nothing.
CASES = [("spmd2", "abort"), ("spmd2", "oom"), ("spmd2", "hang"), ("single", "crash"), ("single", "oom"), ("single", "hang")]


@pytest.mark.slow
@pytest.mark.parametrize(("controller", "fault"), CASES, ids=[f"{f}-{c}" for c, f in CASES])
def test_fault_becomes_status_and_leaves_no_process(tmp_path, monkeypatch, controller, fault):
    monkeypatch.setenv("TUNEKIT_FAULT", fault)
    stall = HANG_STALL_S if fault == "hang" else FAULT_STALL_S
    sets = SMALL + CONTROLLERS[controller] + [f"probe.stall_timeout_s={stall}", "probe.timeout_s=300"]
    watch = ProcessWatch(tmp_path / "run")
    result = run_probe(load_recipe(None, sets), out=tmp_path, run_id="run", progress=watch)
    returned = time.time()

    assert result.status == EXPECTED[fault], result.summary["reason"]
    assert result.summary["steps"] == 1  # step 0 finished, the fault hit step 1
    if controller == "single":  # its start-up as its first step left it: Ray's start and the workload's setup timed
        s = result.summary
        assert s["startup/ray_start_s"] > 0 and s["startup/setup_s"] > 0 and s["startup/workers_start_s"] > 0
        assert s["startup/ray_start_s"] + s["startup/setup_s"] + s["startup/workers_start_s"] < s["startup_s"]
    if fault == "oom" or (fault, controller) == ("abort", "spmd2"):
        # the rank's own last words, not only torchrun's report of a signal
        assert "injected by TUNEKIT_FAULT" in result.summary["reason"], result.summary["reason"]
    if fault == "hang":
        assert "probe.stall_timeout_s" in result.summary["reason"]
        # the kill is prompt: the probe returns within the stall timeout and a margin of its last step
        assert returned - (tmp_path / "run" / STEPS_LIVE).stat().st_mtime < stall + 30
    # the watch saw the probe's processes (so the check below can fail) ...
    expected_kinds = ("raylet", "ray::RoleWorker") if controller == "single" else ("torch.distributed.run", "tunekit.trainer.entry")
    for kind in expected_kinds:
        assert any(kind in cmd for cmd in watch.seen.values()), (kind, watch.seen)
    # ... and none of them is left once run_probe returns
    assert probe_pids(tmp_path / "run") == {}


def test_fault_rule_hits_only_the_recipes_it_names(monkeypatch):
    from tunekit.trainer.faults import fault_for

    two, four = load_recipe(None, ["system.batch.micro_batch_size=2"]), load_recipe(None, ["system.batch.micro_batch_size=4"])
    assert fault_for(two) == fault_for(four) == "none"  # no rule: no fault
    monkeypatch.setenv("TUNEKIT_FAULT", "oom@system.batch.micro_batch_size=2")
    assert (fault_for(two), fault_for(four)) == ("oom", "none")
    monkeypatch.setenv("TUNEKIT_FAULT", "hang@system.memory.gradient_checkpointing=false")
    assert fault_for(two) == "hang"
    monkeypatch.setenv("TUNEKIT_FAULT", "crash")
    assert fault_for(four) == "crash"
    monkeypatch.setenv("TUNEKIT_FAULT", "explode")
    with pytest.raises(ValueError, match="TUNEKIT_FAULT='explode'"):
        fault_for(four)


class HoldUntilSteps:
    """Holds the launcher in its progress call until the probe has finished ``steps`` steps (or ended), so that a
    probe timeout shorter than its start-up passes with those steps done, however slow the start-up: the launcher's
    next check after the hold kills the probe."""

    def __init__(self, run_dir, steps: int, hold_s: float = 300.0) -> None:
        self.run_dir, self.steps, self.hold_s = run_dir, steps, hold_s

    def __call__(self, done: int) -> None:
        deadline = time.monotonic() + self.hold_s
        while done < self.steps and time.monotonic() < deadline and probe_pids(self.run_dir):
            time.sleep(0.2)
            done = steps_done(self.run_dir)


@pytest.mark.slow
def test_a_probe_killed_at_its_limit_keeps_the_steady_figures_of_the_steps_it_finished(tmp_path):
    sets = SMALL + ["probe.timeout_s=1", "probe.steps=100000", "probe.warmup_steps=2"]
    result = run_probe(load_recipe(None, sets), out=tmp_path, run_id="run", progress=HoldUntilSteps(tmp_path / "run", 3))
    s = result.summary
    assert result.status == "timeout" and s["steps"] > 2, s
    steps = read_steps(tmp_path / "run")
    # the medians of the steps past the warm-up, as a finished probe's trainer would have recorded them
    assert s["steady"]["timing_s/step"] == pytest.approx(steps["timing_s/step"].iloc[2:].median())
    assert s["steady_from_step"] == 2 and s["perf/throughput"] > 0
    # and its start-up as its first step left it (startup.json), with its own one-time cost to lend if it started cold
    assert s["startup_s"] > 0 and s["first_step/step_s"] == pytest.approx(steps["timing_s/step"].iloc[0])
    assert s["cost/own_overhead_s"] > 0


def test_a_probe_killed_in_its_teardown_after_all_its_steps_is_ok(tmp_path):
    """Killed at its timeout after its last planned step (a slow machine's teardown ran past the limit): every step
    was measured, so the probe is ok and says it was killed; one killed before its last step is a timeout."""
    from tunekit.launch.failure import outcome

    (tmp_path / STEPS_LIVE).write_text("".join(json.dumps({"step": i, "timing_s/step": 1.0}) + "\n" for i in range(4)))
    killed = "probe passed its timeout (probe.timeout_s) and was killed"
    status, reason = outcome(tmp_path, -9, killed, planned_steps=4)
    assert status == "ok" and reason == f"all 4 steps finished; killed in its teardown: {killed}"
    assert outcome(tmp_path, -9, killed, planned_steps=5) == ("timeout", killed)
    assert outcome(tmp_path, -9, killed) == ("timeout", killed)  # nothing planned to compare with


def test_a_probe_killed_from_outside_says_by_which_signal_not_its_last_log_line(tmp_path):
    from tunekit.launch.failure import outcome

    (tmp_path / STEPS_LIVE).write_text("".join(json.dumps({"step": i, "timing_s/step": 1.0}) + "\n" for i in range(2)))
    (tmp_path / "log.txt").write_text("[tunekit] the tokenizer has no chat template, so prompts are fed as they are\n")
    assert outcome(tmp_path, -9, None, planned_steps=4) == ("failed", "killed by SIGKILL (exit code -9) after 2 step(s)")
    assert outcome(tmp_path, 1, None, planned_steps=4)[1].startswith("exit code 1: [tunekit] the tokenizer")
