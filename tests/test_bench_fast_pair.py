"""benchmarks/fast_pair.sh: its plan is what the two scripts accept, TRL's settings are the ones it states, and the
in-probe update mode runs on CPU and writes a table collect.py can file."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))


def _plan(tmp_path) -> list[list[str]]:
    done = subprocess.run(["bash", str(BENCH / "fast_pair.sh"), str(tmp_path / "fast"), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "fast").iterdir()) == ["plan.txt"]  # a dry run runs nothing
    return [shlex.split(line) for line in (tmp_path / "fast" / "plan.txt").read_text().splitlines()]


def test_the_plan_runs_trl_at_its_best_then_the_default_then_the_update(tmp_path, monkeypatch) -> None:
    import trl_grpo
    import update_bench

    pair, mfu = _plan(tmp_path)
    assert pair[:2] == ["python3", "benchmarks/trl_grpo.py"] and mfu[:2] == ["python3", "benchmarks/update_bench.py"]
    monkeypatch.setattr(sys, "argv", pair[1:])
    args = trl_grpo.parse()
    assert (args.mode, args.engine, args.tunekit_set, args.variant) == ("both", "graphs", [], [])  # tunekit's defaults
    extras = trl_grpo.trl_extras(args)
    assert extras["torch_compile"] is True and extras["vllm_importance_sampling_correction"] is False
    assert extras.get("use_liger_kernel", False) is trl_grpo.liger_importable()
    monkeypatch.setattr(sys, "argv", mfu[1:])
    args = update_bench.parse()
    assert args.probe_shape and args.preset == "qwen2.5-1.5b" and args.out == tmp_path / "fast"


def test_the_tunekit_side_keeps_the_recipe_defaults_for_the_training_path(tmp_path, monkeypatch) -> None:
    import trl_grpo

    pair, _ = _plan(tmp_path)
    monkeypatch.setattr(sys, "argv", pair[1:])
    recipe = trl_grpo.recipe_for(trl_grpo.parse())
    assert recipe.system.compile == "auto" and recipe.system.memory.fsdp_single_gpu == "auto"
    assert (recipe.system.rollout.enforce_eager, recipe.system.rollout.torch_compile) == (False, False)  # graphs


@pytest.mark.slow
def test_the_in_probe_update_runs_on_cpu_and_writes_its_table(tmp_path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(BENCH / "update_bench.py"), "--probe-shape", "--cpu-smoke", "--reps", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads((tmp_path / "update_probe-cpu.json").read_text())
    assert table["meta"]["date"] and set(table["rows"]) == {"default", "before auto (FSDP2, eager)"}
    default = table["rows"]["default"]
    assert default["resolved/compile"] is False and default["update_s"] > 0 and default["mfu"] is None  # CPU: no peak
    assert table["rows"]["before auto (FSDP2, eager)"]["overrides"] == [
        "system.memory.fsdp_single_gpu=true", "system.compile=false"]
