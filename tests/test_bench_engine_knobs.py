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
    assert [j.name for j in jobs] == ["probe", "base", "util_0.3", "util_0.7", "seqs_64", "prefix_off"]
    base, seqs = set(jobs[1].overrides), set(jobs[4].overrides)
    assert base - seqs == {"system.rollout.max_num_seqs=256"} and seqs - base == {"system.rollout.max_num_seqs=64"}
    assert "system.rollout.enable_sleep=false" in base  # an engine alone has nothing to sleep for
    probe = set(jobs[0].overrides)
    assert {"system.rollout.enable_sleep=true", "probe.steps=4", "system.rollout.gpu_memory_utilization=0.5"} <= probe


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
