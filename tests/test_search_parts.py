"""A search run in parts: stopped by --time-limit or SIGTERM, continued by --resume, no finished probe repeated.

Probes are the tiny ones of tests/test_search.py (4 steps, 4 prompts, a few seconds each on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from test_search import MICRO, ROOT, _cmdline_has, trials_of, write_recipe
from tunekit.cli import app

runner = CliRunner()
ROUND = {"confirm_top": 1, "confirm_seeds": 2}
"""A confirmation round of 4 probes: the baseline and one candidate, two seeds each."""


def _search(recipe: Path, out: Path, *extra: str) -> list[str]:
    return ["search", "--recipe", str(recipe), "--budget-yuan", "5", "--trials", "2", "--out", str(out), *extra]


def _probed(out: Path) -> tuple[list[str], list[tuple[int, int]]]:
    """Run dirs of the study's finished probes (trials, then confirmation probes) and the round's (trial, seed)."""
    saved = json.loads((out / "search.json").read_text())
    trials = [t["run_dir"] for t in saved["trials"] if t["duplicate_of"] is None and t["run_dir"]]
    probes = (saved["confirmation"] or {}).get("probes") or []
    return trials + [p["run_dir"] for p in probes], [(p["trial"], p["seed"]) for p in probes]


def _finished_run_dirs(out: Path) -> list[str]:
    return sorted(str(p.parent.resolve()) for p in (out / "runs").glob("*/summary.json")
                  if not json.loads(p.read_text())["reason"].startswith("abandoned"))


@pytest.mark.slow
def test_time_limit_stops_before_a_probe_and_resume_repeats_none(tmp_path):
    # the first probe is expected to take its timeout (20 s) and the kill grace: 25 s, inside the 30 s limit; later
    # ones as long as the longest so far (a few seconds), so each part runs a probe or more and stops before one
    recipe = write_recipe(tmp_path, [MICRO], search=ROUND, timeout_s=20)
    out = tmp_path / "out"
    parts = []
    for _ in range(10):
        res = runner.invoke(app, _search(recipe, out, "--time-limit", "30", *(["--resume"] if parts else [])))
        parts.append(res.exit_code)
        if res.exit_code != 3:
            break
        saved = json.loads((out / "search.json").read_text())
        assert saved["stop_reason"].startswith("time limit: ") and "--resume" in saved["stop_reason"]
        assert saved["resume"].endswith("--time-limit 30 --resume") and f"--out {out}" in saved["resume"]
        assert "continue with: tunekit search" in res.output
    assert parts[0] == 3 and parts[-1] == 0, parts  # 6 probes do not fit in one part of 30 s
    saved = json.loads((out / "search.json").read_text())
    assert saved["resume"] is None and saved["best"] is not None and saved["stop_reason"] == "reached 2 trials"
    run_dirs, round_ = _probed(out)
    (cand,) = saved["confirmation"]["candidates"]
    assert sorted(round_) == [(0, 1), (0, 2), (cand, 1), (cand, 2)]
    assert len(set(run_dirs)) == len(run_dirs) == 6
    assert _finished_run_dirs(out) == sorted(run_dirs)  # every probe that ran is one the answer reads, none twice
    assert saved["confirmation"]["verdict"] in ("confirmed", "within noise", "baseline")


def test_a_time_limit_no_probe_fits_in_stops_at_once_with_exit_3(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO], timeout_s=60)  # the first probe is expected to take 65 s
    out = tmp_path / "out"
    res = runner.invoke(app, _search(recipe, out, "--time-limit", "10"))
    assert res.exit_code == 3, res.output
    assert not (out / "runs").exists()
    assert [s for _, s in trials_of(out / "study.db")] == ["WAITING"]  # the baseline, enqueued for the next part
    saved = json.loads((out / "search.json").read_text())
    assert "expected to take 65 s" in saved["stop_reason"] and saved["resume"]


def test_a_time_limit_that_is_not_positive_is_exit_2(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, _search(write_recipe(tmp_path, [MICRO]), out, "--time-limit", "0"))
    assert res.exit_code == 2 and "--time-limit 0" in res.output and not out.exists()


@pytest.mark.slow
def test_sigterm_during_a_confirmation_probe_reprobes_only_that_one_on_resume(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO], search=ROUND, name="termme")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tunekit", *_search(recipe, out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:  # the round's first probe done, its second under way
            runs = sorted((out / "runs").glob("*-c*-t*")) if (out / "runs").is_dir() else []
            if len(runs) == 2 and (runs[-1] / "steps.jsonl").exists():
                break
            assert proc.poll() is None, "the search ended before it could be stopped"
            time.sleep(0.2)
        else:
            pytest.fail("the confirmation round did not reach its second probe in time")
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 130
    study = optuna.load_study(study_name="termme", storage=f"sqlite:///{out / 'study.db'}")
    kept = study.user_attrs["confirmation"]
    assert kept["running"] and len(kept["probes"]) == 1
    stopped = next(d for d in runs if str(d.resolve()) != kept["probes"][0]["run_dir"])
    assert json.loads((stopped / "summary.json").read_text())["reason"].startswith("abandoned")
    assert study.user_attrs.get("confirmation_claim") is None  # free for the resumed search, on any host

    res = subprocess.run([*args, "--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    run_dirs, round_ = _probed(out)
    assert len(round_) == len(set(round_)) == 4 and kept["probes"][0]["run_dir"] in run_dirs
    assert len(set(run_dirs)) == len(run_dirs) == 6
    assert _finished_run_dirs(out) == sorted(run_dirs)  # the stopped probe ran again, the finished one did not
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline_has(p, str(stopped.resolve()))]

