"""benchmarks/costmodel_in_search.py from a search's records (no probe): each ok trial predicted uncalibrated and
from the trials probed before it (and at a length sampled before any probe), a duplicate trial and a failed one
left out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_costmodel import _probe_dir
from test_costmodel_host import _small, smollm2_shaped  # noqa: F401  (the fixture, imported to be used here)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import costmodel_in_search  # noqa: E402


def test_each_trial_is_predicted_from_the_trials_probed_before_it(smollm2_shaped, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    base = _small(smollm2_shaped, "task.fixed_length=false")
    _probe_dir(runs, "t0", base, None, response=11.0)
    _probe_dir(runs, "t1", _small(smollm2_shaped, "task.fixed_length=false", "system.rollout.gpu_memory_utilization=0.5"),
               None, response=11.0)
    trials = [{"number": 0, "status": "ok", "run_dir": "/elsewhere/runs/t0"},
              {"number": 1, "status": "ok", "run_dir": "/elsewhere/runs/t1"},
              {"number": 2, "status": "fail", "run_dir": "/elsewhere/runs/t2"},
              {"number": 3, "status": "ok", "run_dir": "/elsewhere/runs/t1", "duplicate_of": 1}]
    (tmp_path / "search.json").write_text(json.dumps({"trials": trials}))
    rows = costmodel_in_search.rows(tmp_path, "h200")
    assert [r["trial"] for r in rows] == [0, 1] and "calibrated" not in rows[0]
    first, second = rows
    # the budget overcharges the responses' 11 tokens; the first trial's records price the second's as it ran
    assert first["uncalibrated"]["error"] > 0.3 and second["uncalibrated"]["error"] > 0.3
    assert second["calibrated"]["from_trials"] == [0] and abs(second["calibrated"]["error"]) < 0.02
    assert second["calibrated"]["phases"]["gen"][1] == round(json.loads((runs / "t1" / "summary.json").read_text())["steady"]["timing_s/gen"], 4)
    # a length sampled before any probe (20 of the 32 tokens) is charged uncalibrated, and set against the probe's
    # first steady steps too (here as long as the rest: 11 tokens, the steady step)
    sampled = costmodel_in_search.rows(tmp_path, "h200", sampled_tokens=20.0)[0]["sampled"]
    assert first["uncalibrated"]["step_s"] > sampled["step_s"] > first["measured_step_s"]
    assert (sampled["early_response_tokens"], sampled["early_step_s"]) == (11.0, first["measured_step_s"])
    assert sampled["early_error"] == pytest.approx(sampled["error"], abs=2e-3)
    assert sampled["mean_step_s"] == pytest.approx(first["measured_step_s"], abs=1e-4)  # every step alike here
