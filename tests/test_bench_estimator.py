"""benchmarks/estimator_check.py from run directories (no probe): calibrates on the others, compares the target's
phases, and writes one table collect.py files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from tunekit.config import load_recipe
from tunekit.estimate.costmodel.model import hardware, phases
from tunekit.estimate.memory import model_shape
from tunekit.estimate.profiles import load_profile
from tunekit.rundir import write_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import estimator_check  # noqa: E402


def _run(root: Path, name: str, overrides: list[str], eff: float, card) -> None:
    """A run directory whose phases took the model's time at efficiency ``eff`` on ``card``."""
    recipe = load_recipe(None, overrides)
    run = root / name
    run.mkdir(parents=True)
    write_config(run, recipe)
    steady = {f"timing_s/{n}": w.seconds(eff) for n, w in phases(recipe, model_shape(recipe), hardware(card)).items()}
    steady["timing_s/step"] = sum(steady.values())
    steady["perf/max_memory_reserved_gb"] = 0.5
    (run / "summary.json").write_text(json.dumps({"status": "ok", "profile": card.name, "steady": steady, "wall_s": 30.0,
                                                  "startup_s": 10.0}))
    pd.DataFrame({"timing_s/step": [steady["timing_s/step"]] * 4, "reward/mean": [0.4] * 4}).to_parquet(run / "steps.parquet")


def test_from_runs_compares_the_target_with_what_the_others_calibrate(tmp_path, monkeypatch, capsys):
    card_file = tmp_path / "card.yaml"
    card_file.write_text(yaml.safe_dump(estimator_check.CPU_CARD))
    card = load_profile(str(card_file))
    for label, ref, extra in estimator_check.CPU["calib"]:
        assert ref is None
        _run(tmp_path / "runs", label, extra, 0.2, card)
    ((label, _, extra),) = estimator_check.CPU["targets"]
    _run(tmp_path / "runs", label, extra, 0.2, card)
    out = tmp_path / "out"
    # the script's command line, run in this process (no probe runs: it reads the run directories)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["estimator_check.py", "--cpu", "--from-runs", str(tmp_path / "runs"), "--out", str(out)])
    assert estimator_check.main() == 0, capsys.readouterr().err[-2000:]
    table = json.loads((out / "estimator_check.json").read_text())
    assert table["calibration_n"] == 2 and table["meta"]["date"]
    (target,) = table["targets"].values()
    # the target ran at the efficiency the calibration runs did, so the model predicts it to within rounding
    assert abs(target["step"]["err"]) < 0.01 and abs(target["phases"]["update_actor"]["err"]) < 0.01
    assert target["memory_gib"]["reserved_peak"] == 0.5 and target["memory_gib"]["err_vs_reserved"] is not None
