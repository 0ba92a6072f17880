"""benchmarks/runner_rows.py: the runner comparison row, read from a probe's records (also one cut short)."""

import json
import sys
from pathlib import Path

import pytest

from tunekit import rundir
from tunekit.config import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import runner_rows  # noqa: E402


def _run(d: Path, runner: str, step_s: list[float], summary: dict) -> None:
    d.mkdir(parents=True)
    rundir.write_config(d, load_recipe(None, [f"runner={runner}"] if runner != "builtin" else []))
    with (d / rundir.STEPS_LIVE).open("w") as f:
        for i, s in enumerate(step_s):
            f.write(json.dumps({"step": float(i), "timing_s/step": s, "timing_s/gen": s / 2, "perf/total_tokens": 1000.0,
                                "perf/max_memory_reserved_gb": 10.0 + i}) + "\n")
    (d / rundir.SUMMARY).write_text(json.dumps(summary))


def test_a_probe_cut_short_still_gives_its_steady_steps(tmp_path):
    _run(tmp_path / "runs" / "20261201-0900-a", "trl", [50.0, 9.0, 4.0, 2.0, 3.0, 4.0],
         {"status": "ok", "gpus_held": 1, "startup_s": 30.0, "nvml/mem_used_gb/0": 20.5, "wall_s": 100.0})
    _run(tmp_path / "runs" / "20261201-0800-b", "builtin", [160.0, 2.0, 2.0, 1.0, 4.0],
         {"status": "timeout", "gpus_held": 2})
    b, a = runner_rows.rows([tmp_path], warmup=3)  # in the order they started
    assert (b["runner"], b["status"], b["steps"], b["steady_steps"]) == ("builtin", "timeout", 5, 2)
    assert b["step_s"] == 2.5 and b["gen_s"] == 1.25 and b["first_step_s"] == 160.0
    assert b["tokens_per_s_per_gpu"] == pytest.approx(1000 / 2.5 / 2) and b["reserved_peak_gib"] == 14.0
    assert b["nvml_peak_gib"] is None and b["startup_s"] is None and b["old_logprob_s"] is None
    assert (a["runner"], a["step_s"], a["tokens_per_s_per_gpu"], a["nvml_peak_gib"]) == ("trl", 3.0, 1000 / 3.0, 20.5)
    text = runner_rows.markdown([b, a])
    assert "old_logprob_s" not in text and "| builtin | timeout | 5 | 2 | 2.5 |" in text
