"""Refusals for bad arguments answer before the trainer is imported, quote what the user typed, and ``--help`` says
what each option takes in plain words, with the defaults of --steps and --seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tunekit.cli import app

ROOT = Path(__file__).resolve().parent.parent

CASES = [  # arguments, what the one error line must quote
    (["probe", "--steps", "0"], "--steps 0 (recipe key probe.steps): it must be greater than 0"),
    (["probe", "--runner", "nope"], "--runner nope (recipe key runner):"),
    (["probe", "--set", "system.batch.micro_size=2"], "--set 'system.batch.micro_size'"),
    (["probe", "--gpu-profile", "nope"], "'nope'"),
    (["search", "--budget-yuan", "0"], "--budget-yuan 0:"),
    (["search", "--budget-yuan", "200", "--trials", "0"], "--trials 0:"),
    (["search", "--budget-yuan", "200", "--set", "search.reward_threshold=3"], "search.reward_threshold 3"),
    (["search", "--budget-yuan", "200", "--steps", "5"], "--steps"),
    (["search", "--budget-yuan", "200", "--recipe", "smollm2-arith", "--runner", "trl"],
     "smollm2-arith.yaml's search.space searches the runner itself; drop --runner"),
    (["report", "nowhere"], "nowhere does not exist"),
    (["loadtest", "--url", "http://127.0.0.1:9", "--max-tokens", "0"], "--max-tokens 0 (recipe key loadtest.max_tokens):"),
]

PROBE = """
import contextlib, io, json, sys, time
from tunekit.cli import main
out = []
for args in json.loads(sys.argv[1]):
    sys.argv = ["tunekit", *args]
    err = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
    out.append({"code": code, "text": err.getvalue(), "s": time.perf_counter() - t, "torch": "torch" in sys.modules})
print(json.dumps(out))
"""


def test_bad_arguments_are_refused_before_torch_is_imported_quoting_what_was_typed(tmp_path):
    env = os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps([a for a, _ in CASES])], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    for (args, needle), got in zip(CASES, json.loads(res.stdout.splitlines()[-1])):
        assert got["code"] == 2, (args, got)
        assert needle in got["text"], (args, got["text"])
        assert "with --set probe.steps" not in got["text"]  # never a --set the user did not write
        assert not got["torch"], f"{args} imported torch before refusing"
    assert not any(tmp_path.iterdir())  # nothing written


def test_help_shows_plain_types_and_the_defaults_of_steps_and_seed():
    runner = CliRunner()
    text = runner.invoke(app, ["probe", "--help"], env={"COLUMNS": "200"}).output
    assert "Training steps (default: the recipe's probe.steps, 100 unless the recipe sets it)" in text
    assert "Random seed (default: the recipe's probe.seed, 0 unless the recipe sets it)" in text
    for cmd in (["--help"], ["probe", "--help"], ["search", "--help"], ["report", "--help"], ["estimate", "--help"]):
        shown = runner.invoke(app, cmd, env={"COLUMNS": "200"}).output
        assert "<bool>" not in shown and "<str>" not in shown and "<int>" not in shown and "<list" not in shown, shown


def test_more_bad_input_is_one_sentence_exit_2_and_nothing_written(tmp_path, monkeypatch):
    """Files that are no recipe, output folders that take no folder, an in-memory study database, and estimate
    arguments that name no run or no profile: each one sentence naming what to fix, exit 2, nothing left behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.yaml").write_bytes(b"\x00\xff\xfe")
    (tmp_path / "afile").write_text("x")
    cases = [
        (["probe", "-r", "bin.yaml"], "bin.yaml: not UTF-8 text; save the recipe as UTF-8 YAML."),
        (["probe", "-r", str(tmp_path)], "is a directory; give a recipe's YAML file"),
        (["probe", "--steps", "1", "--out", "/proc/tunekit-out"], "--out /proc/tunekit-out: /proc takes no new folder"),
        (["probe", "--steps", "1", "--set", "probe.out=afile/x"], "probe.out afile/x: afile is a file, not a folder"),
        (["search", "--budget-yuan", "1", "--storage", "sqlite://"], "an in-memory database lives in one connection"),
        (["search", "--budget-yuan", "1", "--storage", "sqlite:///:memory:"], "give a file, e.g. sqlite:///study.db"),
        (["search", "--budget-yuan", "1", "--storage", f"sqlite:///{tmp_path}/afile/s.db"], "afile is a file, not a directory"),
        (["estimate", "--target-steps", "-5"], "--target-steps -5: a full run has at least one step"),
        (["estimate", "--compare-profiles", ","], "--compare-profiles names no profile"),
        (["estimate", "--runner", "bogus"], "--runner bogus (recipe key runner):"),
        (["search", "--budget-yuan", "1", "--study", "../x"], "--study '../x': give a plain name"),
        (["search", "--budget-yuan", "1", "--study", ""], "--study '': give a plain name"),
        # what the runner would refuse is not priced
        (["estimate", "-r", "qwen2.5-0.5b", "--runner", "trl", "--gpu-profile", "h200"],
         "algorithm.name=ppo: the installed TRL ships no maintained PPO trainer"),
        (["estimate", "-r", "qwen2.5-0.5b", "--gpu-profile", "h200", "--set", "system.device_map.rollout=[1]"],
         "system.device_map: controller spmd colocates every role"),
        # a --runs that does not exist is said before anything is printed
        (["estimate", "-r", "qwen2.5-0.5b", "--gpu-profile", "h200", "--runs", "nowhere"], "--runs nowhere: no such directory"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    runner = CliRunner()
    for args, needle in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and needle in " ".join(res.output.split()), (args, res.output)
        assert "Traceback" not in res.output and res.output.lstrip().startswith("error:"), args
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs/, search-out/ or study database
