"""tunekit search: bad input, a real small search, the budget stop, kill -9 + --resume, workers sharing a study in
PostgreSQL.

Probes are tiny (4 steps, 4 prompts) so the file stays within a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from probe_procs import probe_pids
from typer.testing import CliRunner

from tunekit.search import learning, space
from tunekit.cli import app
from tunekit.config import SearchParam, effect_of, list_keys, load_recipe, what_runs
from tunekit.config.errors import TunekitError
from tunekit.search import run_search
from tunekit.search.budget import KILL_GRACE_S
from tunekit.search.objective import BUDGET_CHECK_S

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

TINY = {
    "system": {"batch": {"prompts_per_step": 4, "micro_batch_size": 4}},
    "probe": {"steps": 4, "warmup_steps": 1, "timeout_s": 120},
    "profiler": {"comm_steps": 0},
}


def write_recipe(tmp_path: Path, space_: list[dict], *, name: str = "tiny-search", threshold: float = 0.0,
                 search: dict | None = None, run: dict | None = None, **probe) -> Path:
    """A tiny recipe; no confirmation round unless ``search`` asks for one (it re-probes, so it is slow)."""
    data = json.loads(json.dumps(TINY)) | {"name": name}
    data["probe"] |= probe
    data["search"] = {"reward_threshold": threshold, "reward_window": 2, "space": space_, "confirm_top": 0} | (search or {})
    if run:
        data["run"] = run
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


MICRO = {"key": "system.batch.micro_batch_size", "type": "categorical", "choices": [2, 4]}
CKPT = {"key": "system.memory.gradient_checkpointing", "type": "categorical", "choices": [False, True]}
OOM_WITH_CKPT = "oom@system.memory.gradient_checkpointing=true"
"""``TUNEKIT_FAULT``: the trials that sample checkpointing on end in an injected OOM."""
TEMP = {"key": "task.temperature", "type": "float", "low": 0.9, "high": 1.1}
"""Continuous, so a sampled configuration never repeats an earlier one (no reused results)."""


def pricey_profile(tmp_path: Path) -> Path:
    """A price card at 3600 yuan/h, 1 yuan per second: a CPU probe of a few seconds costs a few yuan."""
    profile = tmp_path / "pricey.yaml"
    profile.write_text("name: pricey\nnvml_pattern: null\nmemory_gib: null\npeak_bf16_tflops: null\n"
                       "yuan_per_gpu_hour: 3600\nprice_source: test\npeak_source: test\n")
    return profile


def trials_of(db: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as c:
        try:
            return c.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
        except sqlite3.OperationalError:  # the study's file exists a moment before its tables do
            return []


# ---------------------------------------------------------------- bad input (no probe runs)


@pytest.mark.parametrize(("space_", "budget", "extra", "needle"), [
    ([MICRO], "0", [], "must be > 0"),
    ([MICRO], "0.0001", [], "below one probe's estimated cost of"),
    ([{"key": "system.batch.micro_size", "type": "categorical", "choices": [2]}], "5", [], "system.batch.micro_size"),
    ([{"key": "system.batch.micro_batch_size", "type": "categorical", "choices": []}], "5", [], "no choices"),
    ([{"key": "system.batch.micro_batch_size", "type": "int", "low": 8, "high": 2}], "5", [], "empty range"),
    ([{"key": "system.batch.micro_batch_size", "type": "categorical", "choices": [0, 4]}], "5", [], "value 0 is invalid"),
    ([MICRO | {"when": {"algorithm.nme": "ppo"}}], "5", [], "algorithm.nme"),
    ([MICRO], "5", ["--storage", "postgresql://nobody:x@127.0.0.1:9/none"], "cannot be reached"),
    ([MICRO], "5", ["--resume"], "no study database"),
    ([MICRO], "5", ["--set", "search.reward_threshold=1.5"],
     "with --set search.reward_threshold=1.5: search.reward_threshold 1.5 is outside the task's reward range"),
    ([MICRO], "5", ["--set", "system.batch.micro_batch_size=8"],
     "with --set system.batch.micro_batch_size=8: search.space[0] system.batch.micro_batch_size: the recipe's own value 8"),
    ([MICRO], "5", ["--set", "search.reward_threshold=-0.2"], "search.reward_threshold -0.2 is outside the task's reward range"),
    ([MICRO], "5", ["--set", "search.confirm_top=4", "--trials", "3"], "search.confirm_top 4 is larger than --trials 3"),
    ([MICRO], "5", ["--set", "run.samples=0"], "run.samples"),
    ([MICRO], "5", ["--set", "run.samples=-32"], "run.samples"),
])
def test_bad_input_is_one_sentence_exit_2_and_creates_nothing(tmp_path, space_, budget, extra, needle):
    recipe = write_recipe(tmp_path, space_)
    out = tmp_path / "out"
    res = runner.invoke(app, ["search", "--recipe", str(recipe), "--budget-yuan", budget, "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert res.output.count("error:") == 1
    assert not out.exists()


def test_existing_study_needs_resume_and_is_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    storage = f"sqlite:///{out / 'study.db'}"
    optuna.create_study(study_name="tiny-search", storage=storage)
    recipe = write_recipe(tmp_path, [MICRO])
    res = runner.invoke(app, ["search", "--recipe", str(recipe), "--budget-yuan", "5", "--out", str(out)])
    assert res.exit_code == 2 and "--resume" in res.output
    res = runner.invoke(app, ["search", "--recipe", str(recipe), "--budget-yuan", "5", "--out", str(out), "--resume", "--study", "other"])
    assert res.exit_code == 2 and "no study named 'other'" in res.output
    assert trials_of(out / "study.db") == []


def test_malformed_profile_is_exit_2_and_creates_nothing(tmp_path):
    bad = tmp_path / "bad-profile.yaml"
    bad.write_text("name: bad\nyuan_per_gpu_hour: -1\n")
    out = tmp_path / "out"
    res = runner.invoke(app, ["search", "--recipe", str(write_recipe(tmp_path, [MICRO])), "--budget-yuan", "5", "--out", str(out),
                              "--gpu-profile", str(bad)])
    assert res.exit_code == 2 and "bad-profile.yaml" in res.output and not out.exists()


def test_estimate_without_earlier_probes_is_exit_2(tmp_path):
    res = runner.invoke(app, ["estimate", "--runs", str(tmp_path)])
    assert res.exit_code == 2 and "no finished probe" in res.output


# ---------------------------------------------------------------- pure parts


def test_conditions_and_baseline_follow_the_recipe():
    recipe = load_recipe("tiny-ppo")
    base = recipe.model_dump(mode="json")
    params = space.baseline_params(recipe.search.space, base, "tiny-ppo")
    assert params["algorithm.name"] == "ppo" and "system.batch.samples_per_prompt" not in params  # grpo-only
    combos = space.grid(recipe.search.space, base)
    assert len(combos) == 32 and all(("system.batch.samples_per_prompt" in c) == (c["algorithm.name"] == "grpo") for c in combos)
    # every grid point's overrides load as a recipe (a device map travels as JSON)
    for c in combos:
        load_recipe("tiny-ppo", space.overrides(c))
    cond = SearchParam(key="x.y", type="categorical", choices=[1], when={"system.rollout.backend": ["vllm", "vllm_server"]})
    assert not space.active(cond, {}, base)
    assert space.active(cond, {"system.rollout.backend": "vllm"}, base)


def test_every_recipe_key_declares_what_it_changes():
    effects = {k: effect_of(k) for k in list_keys()}
    assert set(effects.values()) == {"learning", "systems", "probe"}
    # the global batch changes learning; the micro-batch only memory and speed
    assert effects["system.batch.prompts_per_step"] == effects["system.batch.mini_batch_size"] == "learning"
    assert effects["system.batch.micro_batch_size"] == effects["system.memory.gradient_checkpointing"] == "systems"
    assert effects["algorithm.name"] == "learning" and effects["probe.steps"] == effects["profiler.comm_steps"] == "probe"
    # what estimate matches on: a probe-only change leaves it alone, a systems change does not
    base = load_recipe("tiny-ppo")
    assert what_runs(base) == what_runs(load_recipe("tiny-ppo", ["probe.seed=3", "profiler.comm_steps=0"]))
    assert what_runs(base) != what_runs(load_recipe("tiny-ppo", ["system.batch.micro_batch_size=8"]))


def test_learning_check_flags_only_systems_pairs_beyond_noise():
    flat = [0.5, 0.52, 0.48, 0.5, 0.51, 0.49, 0.5, 0.5]
    up = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99]
    a = {"system.batch.micro_batch_size": 4, "algorithm.name": "ppo"}
    b = {"system.batch.micro_batch_size": 8, "algorithm.name": "ppo"}
    c = {"system.batch.micro_batch_size": 8, "algorithm.name": "grpo"}
    compared, found = learning.check_pairs([(0, a, flat), (1, b, up), (2, c, up)], window=4)
    assert compared == 1 and [(m.trial_a, m.trial_b) for m in found] == [(0, 1)]  # 0 vs 2 differs in a learning key
    assert "system.batch.micro_batch_size" in found[0].sentence()
    noisy = [x + (0.01 if i % 2 else -0.01) for i, x in enumerate(flat)]
    assert learning.check_pairs([(0, a, flat), (1, b, noisy)], window=4) == (1, [])
    assert learning.differs_only_in_systems({"system.batch.prompts_per_step": 8}, {"system.batch.prompts_per_step": 16}) is None
    # alike at the end but not on the way: the whole curve flags it (0.2 against 0.5, the bound about 0.13)
    late = [0.1 + (0.01 if i % 2 else -0.01) for i in range(12)] + [0.5, 0.52, 0.48, 0.5]
    early = [0.5 + (0.01 if i % 2 else -0.01) for i in range(12)] + [0.5, 0.52, 0.48, 0.5]
    (flagged,) = learning.check_pairs([(0, a, late), (1, b, early)], window=4)[1]
    assert flagged.last_diff == 0 and flagged.curve_diff > flagged.curve_bound
    # two curves a few standard errors apart: each step +-0.01 about its level, so one curve's mean has a standard
    # error of 0.01069 / sqrt 8 = 0.00378 and the difference of two sqrt 2 times that, 0.00535: flagged at 3.5 of
    # those (the bound is 3), not at 2.5
    wobble = [0.01 if i % 2 else -0.01 for i in range(8)]
    for apart, flags in ((2.5, False), (3.5, True)):
        shifted = [0.5 + apart * 0.005345 + w for w in wobble]
        found = learning.check_pairs([(0, a, [0.5 + w for w in wobble]), (1, b, shifted)], window=8)[1]
        assert bool(found) == flags, apart


def test_a_flagged_pair_is_decided_again_over_the_confirmation_seeds():
    # one probe each: 0.40 against 0.49 with steady per-step rewards, flagged
    low, high = [0.40, 0.41, 0.39, 0.40, 0.40, 0.41], [0.49, 0.48, 0.50, 0.49, 0.49, 0.48]
    a, b = {"system.controller": "spmd"}, {"system.controller": "single"}
    # seeds that spread as much as the gap (0.41/0.45/0.50 vs 0.49/0.47/0.48): cleared
    _, (m,) = learning.check_pairs([(0, a, low), (1, b, high)], window=3, seed_rewards={0: [0.41, 0.45, 0.50], 1: [0.49, 0.47, 0.48]})
    assert not m.holds and m.seeds["n"] == [3, 3] and m.seeds["diff"] < m.seeds["bound"]
    assert "learn alike" in m.sentence() and "changed learning" not in m.sentence()
    # seeds that agree among themselves and stay apart: it holds
    _, (m,) = learning.check_pairs([(0, a, low), (1, b, high)], window=3, seed_rewards={0: [0.40, 0.41, 0.40], 1: [0.49, 0.48, 0.49]})
    assert m.holds and "changed learning" in m.sentence() and "3 and 3 seeds" in m.sentence()
    # a trial the round did not run keeps the one-probe verdict
    _, (m,) = learning.check_pairs([(0, a, low), (1, b, high)], window=3, seed_rewards={0: [0.41, 0.45, 0.50]})
    assert m.seeds is None and m.holds


# ---------------------------------------------------------------- real searches


@pytest.mark.slow
def test_small_search_baseline_first_fault_is_infeasible_and_search_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEKIT_FAULT", OOM_WITH_CKPT)
    # the run lasts until the 2-step mean reward reaches 0: every ok probe gets there at step 2
    recipe_path = write_recipe(tmp_path, [CKPT, MICRO], run={"until": "threshold"})
    recipe = load_recipe(str(recipe_path))
    out = tmp_path / "out"
    events = []
    # seed 7: the sampler's random picks after the baseline are (checkpointing on: oom, 4) then (off, 2)
    result = run_search(recipe, budget_yuan=5, trials=3, out_dir=out, progress_cb=events.append, seed=7,
                        recipe_ref=str(recipe_path))
    rows = result.trials
    probed = [r for r in rows if r["duplicate_of"] is None]
    assert len(probed) == 3 and all(r["state"] == "COMPLETE" for r in rows)  # a repeat does not use up a trial
    assert [r["number"] for r in rows] == list(range(len(rows)))  # Optuna's numbers, one per row
    assert rows[0]["baseline"] and rows[0]["params"] == {"system.memory.gradient_checkpointing": False,
                                                       "system.batch.micro_batch_size": 4}
    oom = [r for r in rows if r["params"]["system.memory.gradient_checkpointing"]]
    assert oom, "the seed no longer samples the fault; pick another seed"
    assert all(r["status"] == "oom" and not r["feasible"] and r["verdict"] is None and "out of memory" in r["reason"]
               for r in oom if r["duplicate_of"] is None)
    ok = [r for r in probed if r["status"] == "ok"]
    assert ok and all(r["projected_steps"] == 2 and "first reached 0 at step 2" in r["run_rule"] for r in ok)
    assert all(r["verdict"] == "feasible" and r["reward_ci"][0] <= r["reward"] <= r["reward_ci"][1] for r in ok)
    # a systems variant of the baseline (same learning keys, same seed) inherits its learning
    variants = [r for r in ok if not r["baseline"]]
    assert all(r["learning_of"] == 0 and r["reward"] == rows[0]["reward"] for r in variants)
    assert result.best is not None and result.best["feasible"] and not result.best["params"]["system.memory.gradient_checkpointing"]
    assert result.verdict == "unconfirmed" and "no confirmation round" in result.answer and result.confirmation is None
    assert result.saving_yuan is None or result.saving_yuan >= 0
    # the command runs the full run that was priced (its projected steps, not the probe's) on the answer's recipe
    argv = shlex.split(result.command)
    assert argv[:3] == ["cd", str(out), "&&"] and argv[3:5] == ["tunekit", "probe"] and argv[argv.index("--steps") + 1] == "2"
    answer = load_recipe(str(out / argv[argv.index("--recipe") + 1]))
    assert not answer.system.memory.gradient_checkpointing and answer.system.batch.micro_batch_size == result.best["params"]["system.batch.micro_batch_size"]
    assert answer.probe.out == str(tmp_path / "out-full-run")  # beside the search's probes, not among them
    saved = json.loads((out / "search.json").read_text())
    assert len(saved["trials"]) == len(rows) and saved["best"]["number"] == result.best["number"]
    assert saved["command"] == result.command and saved["run"]["until"] == "threshold"
    assert all(t["reward_ci"] is None or len(t["reward_ci"]) == 2 for t in saved["trials"])
    assert 0 < result.spent_yuan <= 5
    assert any(e["event"] == "step" for e in events)
    # the live line says what the table says
    from tunekit.search.result import label
    from tunekit.search.view import trial_line

    lines = [trial_line(e["trial"]) for e in events if e["event"] == "done"]
    assert [f"trial {r['number']}: {label(r)}" for r in rows if r["duplicate_of"] is None] == [ln.split(",")[0] for ln in lines
                                                                                            if "same configuration" not in ln]
    # the best trial's probe is a normal run dir: `tunekit estimate` projects the recipe from it
    res = runner.invoke(app, ["estimate", "--recipe", str(recipe_path), "--runs", str(out / "runs")])
    assert res.exit_code == 0, res.output
    assert "projection of tiny-search" in res.output


@pytest.mark.slow
def test_budget_stops_before_a_probe_would_pass_it(tmp_path):
    # 3600 yuan/h = 1 yuan per second: a 4-step CPU probe (a few seconds) costs a few yuan, so the
    # budget below admits a few probes; the continuous TEMP knob never runs out of new configurations
    profile = pricey_profile(tmp_path)
    recipe = load_recipe(str(write_recipe(tmp_path, [MICRO, TEMP], timeout_s=12)))
    budget = (12 + 5) * 1.0 + 0.5  # just above the first probe's conservative estimate (timeout + grace)
    result = run_search(recipe, budget_yuan=budget, trials=20, out_dir=tmp_path / "out", gpu_profile=str(profile), seed=0)
    assert result.stop_reason.startswith("budget"), result.stop_reason
    probed = [r for r in result.trials if r["duplicate_of"] is None]
    assert 1 <= len(probed) < 20
    assert result.spent_yuan <= budget + 1.0 * 3  # a capped probe may overrun by its kill time only
    # it stopped because the next probe, the median one with the kill grace its capped timeout leaves (5 s at 1
    # yuan a second), would pass the budget
    whole = sorted(r["probe_yuan"] for r in probed if r["status"] == "ok")
    median = whole[len(whole) // 2] if whole else 0.0
    assert result.spent_yuan + median + KILL_GRACE_S > budget * 0.999 or any(r["status"] == "timeout" for r in probed)


def signal_when(proc: subprocess.Popen, ready, sig: int, what: str, within_s: float = 300.0) -> int:
    """Polls ``ready()`` while the search ``proc`` runs, then sends it ``sig`` (also when the wait failed) and returns
    its exit code; the test fails when ``proc`` ends first or ``what`` is not ready within ``within_s``."""
    deadline = time.monotonic() + within_s
    try:
        while not ready():
            assert proc.poll() is None, f"the search ended before {what}"
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {within_s:.0f} s")
            time.sleep(0.2)
    finally:
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    return rc


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO, TEMP], name="killme")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tunekit", "search", "--recipe", str(recipe), "--budget-yuan", "5", "--trials", "2", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    db = out / "study.db"
    orphans: dict[int, str] = {}

    def second_probe_under_way() -> bool:  # the baseline done and a process of the second trial's probe alive
        states = [s for _, s in trials_of(db)] if db.exists() else []
        if states.count("COMPLETE") >= 1 and "RUNNING" in states:
            for run_dir in (out / "runs").glob("*-t1"):
                orphans.update(probe_pids(run_dir))
        return bool(orphans)

    signal_when(proc, second_probe_under_way, signal.SIGKILL, "the baseline done and a second probe started")
    assert {pid for pid in orphans if psutil.pid_exists(pid)}  # the probe outlives its killed search (its own session)
    before = {n: s for n, s in trials_of(db)}
    assert list(before.values()).count("COMPLETE") == 1 and before[1] == "RUNNING"

    res = runner.invoke(app, [*args[3:], "--resume"])  # the resume in this process: the killed one's state is on disk
    assert res.exit_code == 0, res.output[-2000:]
    study = optuna.load_study(study_name="killme", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert trials[0].state.name == "COMPLETE"
    assert trials[1].state.name == "FAIL"
    assert [t.user_attrs.get("retry_of") for t in trials if t.number > 1][0] == 1  # the killed trial, retried first
    assert trials[2].params == trials[1].params
    row = json.loads((out / "search.json").read_text())["trials"][1]  # said so, not a bare "fail"
    assert (row["status"], row["reason"]) == ("stopped", "stopped before its end; probed again as trial 2")
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 2
    probed = [t for t in done if "duplicate_of" not in t.user_attrs]
    run_dirs = [t.user_attrs["run_dir"] for t in probed]
    assert len(set(run_dirs)) == len(run_dirs)  # no probe ran twice
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/summary.json")}
    finished = [k for k, s in summaries.items() if not s["reason"].startswith("abandoned")]
    assert sorted(finished) == sorted(Path(d).name for d in run_dirs)  # every finished probe belongs to one completed trial
    abandoned = Path(trials[1].user_attrs["run_dir"])
    assert summaries[abandoned.name]["status"] == "failed" and "abandoned" in summaries[abandoned.name]["reason"]
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline_has(p, str(abandoned))]
    assert probe_pids(abandoned) == {}  # the resume ended the orphaned probe


def _cmdline_has(p: Path, needle: str) -> bool:
    try:
        return needle.encode() in p.read_bytes()
    except OSError:
        return False


def _postgres_url() -> str | None:
    if os.environ.get("TUNEKIT_TEST_POSTGRES_URL"):
        return os.environ["TUNEKIT_TEST_POSTGRES_URL"]
    f = ROOT / ".ci" / "postgres-url"
    return f.read_text().strip() if f.exists() else None


def _sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


@pytest.fixture
def pg_study():
    """The test database's URL and a fresh study name; the study is deleted afterwards."""
    url = _postgres_url()
    if url is None:
        pytest.skip("no PostgreSQL: run `bash .ci/start-postgres.sh` or set TUNEKIT_TEST_POSTGRES_URL")
    name = f"tunekit-test-{os.getpid()}-{time.time_ns() % 10**9}"
    yield url, name
    try:
        optuna.delete_study(study_name=name, storage=_sqlalchemy_url(url))
    except KeyError:
        pass


@pytest.mark.slow
@pytest.mark.service("PostgreSQL")
def test_two_concurrent_workers_lose_nothing_repeat_nothing_and_keep_the_budget(tmp_path, pg_study):
    url, name = pg_study
    # 1 yuan per second: the resumed budget below admits both workers' first probes and binds soon after
    profile = pricey_profile(tmp_path)
    recipe = write_recipe(tmp_path, [MICRO, TEMP], timeout_s=60)
    common = ["search", "--recipe", str(recipe), "--storage", url, "--study", name, "--gpu-profile", str(profile)]
    # the first worker makes the study in PostgreSQL and probes its baseline; the others join it with --resume
    first = runner.invoke(app, [*common, "--budget-yuan", "70", "--trials", "1", "--out", str(tmp_path / "w0")])
    assert first.exit_code == 0, first.output
    (base,) = optuna.load_study(study_name=name, storage=_sqlalchemy_url(url)).get_trials()
    assert base.state.name == "COMPLETE" and base.user_attrs["baseline"]
    # spent + 3 baseline-sized probes (side by side on 2 cores each runs longer) + what each of the two running
    # probes' guards keeps back (check interval and kill time; at 1 yuan/s, seconds are yuan): both workers' first
    # probes fit, and the budget ends the search soon after
    budget = 4 * base.user_attrs["probe_yuan"] + 2 * (BUDGET_CHECK_S + KILL_GRACE_S)
    argv = [sys.executable, "-m", "tunekit", *common, "--budget-yuan", f"{budget:.3f}", "--trials", "12", "--resume"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    workers = [subprocess.Popen([*argv, "--out", str(tmp_path / w)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for w in ("wa", "wb")]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode in (0, 1), err[-2000:]  # 1: no feasible trial is fine here, a crash is not
    trials = optuna.load_study(study_name=name, storage=_sqlalchemy_url(url)).get_trials()
    # every trial number once, and every trial settled: none lost to a crashed or racing worker
    assert [t.number for t in trials] == list(range(len(trials)))
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    probed = [t for t in trials if "duplicate_of" not in t.user_attrs]
    assert 3 <= len(probed) <= 12 and len(trials) == len(probed) + sum("duplicate_of" in t.user_attrs for t in trials)
    # no configuration probed twice, no probe run twice, and every run dir belongs to a probed trial (a probe the
    # budget stopped before its first step leaves none)
    configs = [json.dumps(t.params, sort_keys=True) for t in probed]
    assert len(set(configs)) == len(configs)
    run_dirs = [Path(t.user_attrs["run_dir"]).name for t in probed]
    assert len(set(run_dirs)) == len(run_dirs)
    assert {p.parent.name for p in tmp_path.glob("w*/runs/*/summary.json")} <= set(run_dirs)
    # both resumed workers probed, at the same time
    resumed = [t for t in probed if t.number > 0]
    by_worker = {t.user_attrs["worker"] for t in resumed}
    assert len(by_worker) == 2, by_worker
    assert any(a.user_attrs["worker"] != b.user_attrs["worker"] and a.datetime_start < b.datetime_complete
               and b.datetime_start < a.datetime_complete for a in resumed for b in resumed), "the workers never overlapped"
    # the budget: spent at most one probe's estimate (the median probe) past it
    spends = sorted(t.user_attrs["probe_yuan"] for t in probed)
    assert sum(spends) <= budget + spends[len(spends) // 2], (sum(spends), spends)
    # each resumed worker's record counts the whole study's spend: the first worker's baseline and its own probes
    for w in ("wa", "wb"):
        assert json.loads((tmp_path / w / "search.json").read_text())["spent_yuan"] > base.user_attrs["probe_yuan"]


def test_a_configuration_that_would_not_fit_is_skipped_without_a_probe(tmp_path):
    # a CPU price card with 1 MiB of memory: the embedded model's states alone (about 16 MB) cannot fit
    card = yaml.safe_load((ROOT / "profiles" / "cpu.yaml").read_text()) | {"name": "one-mib", "memory_gib": 1 / 1024}
    (tmp_path / "one-mib.yaml").write_text(yaml.safe_dump(card))
    recipe_path = write_recipe(tmp_path, [MICRO])
    out = tmp_path / "out"
    result = run_search(load_recipe(str(recipe_path)), budget_yuan=5, trials=2, out_dir=out,
                        gpu_profile=str(tmp_path / "one-mib.yaml"), recipe_ref=str(recipe_path))
    probed = [r for r in result.trials if r["duplicate_of"] is None]
    assert probed and all(r["status"] == "skipped" and r["reason"].startswith("would not fit: GPU 0") for r in probed)
    assert result.best is None and result.spent_yuan == 0
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())  # no probe ran


def test_every_shipped_recipe_enqueues_its_own_values_as_the_baseline():
    """A recipe whose own value is not among its space's choices cannot start a search (e.g. an `auto` default)."""
    from tunekit.config import RECIPES_DIR

    searched = [p.stem for p in sorted(RECIPES_DIR.glob("*.yaml")) if load_recipe(p.stem).search.space]
    assert "tiny-h200" in searched and "tiny-ppo" in searched
    for name in searched:
        recipe = load_recipe(name)
        params = space.baseline_params(recipe.search.space, recipe.model_dump(mode="json"), name)
        assert params, name


def test_a_reference_that_sets_a_learning_key_is_paired_with_no_trial(tmp_path):
    """A reference (another framework at its own defaults) sets keys outside the space; one of them a learning
    rate, it learns otherwise than every trial, so no pair with it is a systems-only pair. One that sets only
    systems keys, or a learning key at the recipe's own value, still pairs."""
    import pandas as pd

    from tunekit.search.result import learning_check

    base = load_recipe("tiny-grpo", ["search.space=[{key: system.batch.micro_batch_size, type: categorical, choices: [8, 16]}]"])
    raw = {"system": {"batch": {"micro_batch_size": 16}}}
    curve = [0.5, 0.52, 0.48, 0.5, 0.51, 0.49, 0.5, 0.5]

    def row(n, micro, sets=()):
        run = tmp_path / f"t{n}"
        run.mkdir()
        pd.DataFrame({"step": range(8), "reward/mean": curve}).to_parquet(run / "steps.parquet")
        return {"number": n, "params": {"system.batch.micro_batch_size": micro}, "sets": list(sets), "status": "ok",
                "duplicate_of": None, "run_dir": str(run)}

    lr = base.algorithm.actor_lr
    rows = [row(0, 16), row(1, 8), row(2, 16, ["algorithm.actor_lr=1.0e-9", "system.memory.gradient_checkpointing=true"]),
            row(3, 8, [f"algorithm.actor_lr={lr}", "system.memory.gradient_checkpointing=true"])]
    # pairs: 0-1, 0-3 and 1-3 (3 sets the recipe's own rate); 2 pairs with none
    assert learning_check(rows, base, raw)["pairs_compared"] == 3



def test_a_resumed_study_keeps_its_recipe_and_price_profile(tmp_path):
    """Its trials ran, and were priced, with what the study started with: a resume that changes a key a step runs
    with, or the price profile, is refused naming it, and the study is left alone."""
    from tunekit.search.setup import KEPT_ATTR, _kept, make_setup

    out = tmp_path / "out"
    out.mkdir()
    recipe = write_recipe(tmp_path, [MICRO])
    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.create_study(study_name="tiny-search", storage=storage)
    setup = make_setup(load_recipe(str(recipe)), 5.0, 4, out, None, "recipe")
    study.set_user_attr(KEPT_ATTR, _kept(setup))  # as the study's first part kept it
    base = ["search", "--recipe", str(recipe), "--budget-yuan", "5", "--out", str(out), "--resume"]
    res = runner.invoke(app, [*base, "--set", "system.batch.prompts_per_step=8"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "--resume: system.batch.prompts_per_step in" in said and "is 8 but 4 in" in said and "resume with the same recipe" in said
    res = runner.invoke(app, [*base, "--gpu-profile", "h100-80g"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "the price profile is 'h100-80g' but study 'tiny-search' priced its probes with 'cpu'" in said
    assert trials_of(out / "study.db") == []


def test_two_searches_making_one_new_databases_tables_at_once_both_open_it(tmp_path, monkeypatch):
    """Optuna's first creation of its tables, lost to another process mid-way (its schema version row, or a table it
    went to make, exists by now), is not an unreachable storage: the later search opens the tables as the other made
    them. Any other error is one sentence."""
    from tunekit.search import storage as studies

    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.storages.RDBStorage(url)  # the other search made the tables
    real = studies._rdb

    def lost_once(message: str):
        calls = []

        def rdb(u):
            calls.append(u)
            if len(calls) == 1:
                raise RuntimeError(message)
            return real(u)
        return rdb, calls

    for message in ("(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num",
                    "(sqlite3.OperationalError) table trials already exists"):
        rdb, calls = lost_once(message)
        monkeypatch.setattr(studies, "_rdb", rdb)
        assert isinstance(studies.open_storage(url, must_exist=False), optuna.storages.RDBStorage) and len(calls) == 2
    monkeypatch.setattr(studies, "_rdb", lambda u: (_ for _ in ()).throw(RuntimeError("disk I/O error")))
    with pytest.raises(TunekitError, match="cannot be reached \\(disk I/O error\\)"):
        studies.open_storage(url, must_exist=False)
