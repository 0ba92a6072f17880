"""benchmarks/engine_knobs.py: its plan (one change at a time, each preset's engine runs then its probe), the error
summary over runs, and a table collect.py files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from collect import entry
from engine_knobs import error_summary, plan, write


def test_plan_starts_each_preset_with_its_probe_and_changes_one_knob_at_a_time():
    by_preset = plan(["qwen2.5-0.5b", "qwen2.5-1.5b"], "vllm", "cuda", [], probe_steps=4)
    jobs = by_preset["qwen2.5-1.5b"]
    assert [j.name for j in jobs] == ["probe", "base", "util_0.3", "util_0.7", "base_repeat", "seqs_64", "prefix_off"]
    base, seqs = set(jobs[1].overrides), set(jobs[5].overrides)
    assert set(jobs[4].overrides) == base  # the base again, after the utilization runs
    assert base - seqs == {"system.rollout.max_num_seqs=256"} and seqs - base == {"system.rollout.max_num_seqs=64"}
    assert "system.rollout.enable_sleep=false" in base  # an engine alone has nothing to sleep for
    probe = set(jobs[0].overrides)
    assert {"system.rollout.enable_sleep=true", "probe.steps=4", "system.rollout.gpu_memory_utilization=0.5"} <= probe


def test_more_sequence_limits_are_baseline_runs_that_change_only_max_num_seqs():
    jobs = plan(["smollm2-arith"], "vllm", "cuda", [], probe_steps=3, seqs=[128, 64, 512])["smollm2-arith"]
    names = [j.name for j in jobs]
    assert names[-2:] == ["seqs_128", "seqs_512"] and names.count("seqs_64") == 1  # a limit already run is not repeated
    base = set(jobs[1].overrides)
    for job, n in ((jobs[-2], 128), (jobs[-1], 512)):
        assert base - set(job.overrides) == {"system.rollout.max_num_seqs=256"}
        assert set(job.overrides) - base == {f"system.rollout.max_num_seqs={n}"}


def test_hf_smoke_plan_leaves_out_the_engine_only_knobs():
    jobs = plan(["tiny-grpo"], "hf", "cpu", ["task.max_new_tokens=8"], probe_steps=2)["tiny-grpo"]
    assert not any("max_num_seqs" in o or "prefix_caching" in o for j in jobs for o in j.overrides)
    assert "task.max_new_tokens=8" in jobs[1].overrides  # extra sets come after the shape, so they win


def test_error_summary_is_the_median_and_the_largest_error_in_size():
    rows = {"a": {"error": -0.2}, "b": {"error": 0.05}, "c": {"error": 0.1}, "d": {"error": None}, "e": {}}
    assert error_summary(rows) == {"n": 3, "median": 0.05, "worst": -0.2}
    assert error_summary({}) == {"n": 0, "median": None, "worst": None}


def test_the_table_is_one_collect_py_files(tmp_path):
    rows = {"qwen2.5-0.5b/base": {"kind": "engine", "status": "ok", "gen_s": 2.0, "est_peak_gb": 72.0,
                                  "measured_peak_gb": 80.0, "error": -0.1, "run_dir": "/tmp/x/runs/r1"}}
    meta = {"date": "2026-11-30", "gpu": "NVIDIA H200", "command": "c", "shape": "s"}
    write(tmp_path, rows, meta)
    table = json.loads((tmp_path / "engine_knobs.json").read_text())
    assert table["meta"]["estimate_error"] == {"n": 1, "median": pytest.approx(-0.1), "worst": pytest.approx(-0.1)}
    e = entry(tmp_path / "engine_knobs.json", machine="nvidia-h200", date=None, note="")
    assert e["date"] == "2026-11-30" and e["table"]["rows"]["qwen2.5-0.5b/base"]["run_dir"] == "$OUT/r1"
    assert "| qwen2.5-0.5b/base | engine | ok | 2 | 1.00x |" in (tmp_path / "engine_knobs.md").read_text()


def test_a_change_is_read_against_the_mean_of_the_two_base_runs(tmp_path):
    rows = {"p/base": {"kind": "engine", "status": "ok", "gen_s": 4.0},
            "p/util_0.7": {"kind": "engine", "status": "ok", "gen_s": 2.4},
            "p/base_repeat": {"kind": "engine", "status": "ok", "gen_s": 2.0},
            "q/base": {"kind": "engine", "status": "ok", "gen_s": 2.0},  # its repeat did not run: the one base
            "q/seqs_64": {"kind": "engine", "status": "ok", "gen_s": 5.0},
            "q/base_repeat": {"kind": "engine", "status": "timeout", "reason": "the preset's share ran out"}}
    write(tmp_path, rows, {"date": "2026-12-01", "gpu": "NVIDIA H200", "command": "c", "shape": "s"})
    md = (tmp_path / "engine_knobs.md").read_text()
    assert "| p/util_0.7 | engine | ok | 2.4 | 0.80x |" in md  # 2.4 / mean(4.0, 2.0)
    assert "| p/base | engine | ok | 4 | 1.33x |" in md and "| p/base_repeat | engine | ok | 2 | 0.67x |" in md
    assert "| q/seqs_64 | engine | ok | 5 | 2.50x |" in md
