"""benchmarks/smollm2_curves.py: its probes are the recipe's under each runner and seed, sharing the card; its summary
reads each probe's records (one cut short too)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from tunekit import rundir
from tunekit.config import effect_of, load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import smollm2_curves  # noqa: E402


def _probe(d: Path, rates: list[float], summary: dict | None) -> None:
    d.mkdir(parents=True)
    rundir.write_config(d, load_recipe(None))
    with (d / rundir.STEPS_LIVE).open("w") as f:
        for i, r in enumerate(rates):
            f.write(json.dumps({"step": float(i), "reward/mean": r, "response_length/mean": 20.0 - i,
                                "timing_s/step": 1.5}) + "\n")
    if summary is not None:
        (d / rundir.SUMMARY).write_text(json.dumps(summary))


def test_the_summary_gives_each_probes_curve_and_each_runners_mean(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _probe(out / "runs" / "builtin-s0" / "r1", [0.1] * 10 + [0.9] * 10,
           {"status": "ok", "startup_s": 200.0, "steady": {"timing_s/step": 1.45}})
    _probe(out / "runs" / "builtin-s1" / "r2", [0.3] * 10 + [0.7] * 10, {"status": "ok"})
    _probe(out / "runs" / "trl-s0" / "r3", [0.2, 0.4, 0.6], None)  # killed before its summary
    pd.DataFrame({"step": [0, 0, 0, 19], "prompt": ["What is 1 + 1?"] * 4, "response": ["2", "3", "4", "2"],
                  "answer": ["2"] * 4, "reward": [1.0, 0.0, 0.0, 1.0]}).to_parquet(
        out / "runs" / "builtin-s0" / "r1" / rundir.SAMPLES)
    runs = tmp_path / "elsewhere"  # where the probes ran: their files are copied into OUT, compile caches are not
    (out / "runs").rename(runs)
    (runs / "builtin-s0" / "compile-cache").mkdir()
    monkeypatch.setattr(sys, "argv", ["smollm2_curves.py", "--out", str(out), "--runs", str(runs), "--collect"])
    assert smollm2_curves.main() == 0
    assert sorted(p.name for p in (out / "runs" / "builtin-s0").iterdir()) == ["r1"]
    result = json.loads((out / "smollm2_curves.json").read_text())
    b0, t0 = result["runs"]["builtin-s0"], result["runs"]["trl-s0"]
    assert (b0["status"], b0["steps"], b0["exact_first10"], b0["exact_last10"]) == ("ok", 20, 0.1, 0.9)
    assert b0["steady_step_s"] == 1.45 and b0["response_length"][:2] == [20.0, 19.0]
    assert [r["response"] for r in b0["samples"]["step 0"]] == ["2", "3"] and len(b0["samples"]["step 19"]) == 1
    assert (t0["status"], t0["steps"], t0["exact_last10"]) == ("missing", 3, 0.4)
    assert result["per_runner"]["builtin"]["seeds"] == 2
    assert result["per_runner"]["builtin"]["mean_exact_rate"][0] == 0.2 and result["per_runner"]["builtin"]["mean_exact_rate"][-1] == 0.8
    assert "| builtin-s0 | ok | 20 | 0.1 | 0.9 | 1.45 | 200 |" in (out / "smollm2_curves.md").read_text()


def test_every_runner_and_seed_probes_the_recipe_inside_the_budget(tmp_path, monkeypatch):
    started = []

    class Recorded:
        def __init__(self, cmd, **_):
            started.append(cmd)

    monkeypatch.setattr(smollm2_curves.subprocess, "Popen", Recorded)
    monkeypatch.setattr(smollm2_curves, "STAGGER_S", 0.0)
    monkeypatch.setattr(sys, "argv", ["smollm2_curves.py", "--out", str(tmp_path), "--seeds", "0", "1"])
    args = smollm2_curves.parse()
    smollm2_curves.launch(args, tmp_path, smollm2_curves.time.monotonic())
    assert len(started) == 4
    for cmd in started:
        sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
        assert cmd[cmd.index("--recipe") + 1] == "smollm2-arith" and cmd[cmd.index("--steps") + 1] == "100"
        assert "system.rollout.gpu_memory_utilization=0.100" in sets  # four engines share 0.4 of the card
        assert "system.rollout.enable_sleep=false" in sets  # no engine frees memory while a neighbour's starts
        assert 60 <= int(next(s for s in sets if s.startswith("probe.timeout_s=")).split("=")[1]) <= 480
        # only the engine's share, its sleep and the time limit differ from the recipe: both leave learning alone
        assert {effect_of(s.split("=")[0]) for s in sets} == {"systems", "probe"}
        load_recipe("smollm2-arith", sets)
    assert sorted((c[c.index("--runner") + 1], c[c.index("--seed") + 1]) for c in started) == [
        ("builtin", "0"), ("builtin", "1"), ("trl", "0"), ("trl", "1")]


def test_verl_probes_the_recipe_as_its_single_controller_and_verl_accepts_it(tmp_path, monkeypatch):
    from tunekit.runners.verl_refusals import refusals

    started = []
    monkeypatch.setattr(smollm2_curves.subprocess, "Popen", lambda cmd, **_: started.append(cmd))
    monkeypatch.setattr(sys, "argv", ["smollm2_curves.py", "--out", str(tmp_path), "--runners", "verl"])
    smollm2_curves.launch(smollm2_curves.parse(), tmp_path, smollm2_curves.time.monotonic())
    (cmd,) = started
    sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
    assert cmd[cmd.index("--runner") + 1] == "verl" and "system.controller=single" in sets
    recipe = load_recipe("smollm2-arith", [*sets, "runner=verl"])
    assert refusals(recipe, True) == []  # on a GPU machine verl runs it as set
    assert refusals(load_recipe("smollm2-arith", ["runner=verl"]), True)  # without the set, it would be refused
