"""A search run in parts: stopped by --time-limit or SIGTERM, continued by --resume, no finished probe repeated;
references (``search.references``) probed in the first part they fit in, the trials that fit running before them,
confirmed beside the baseline and quoted in the answer; the confirmation round's alternation and paired ratios, read
from the search run in parts.

Probes are the tiny ones of tests/test_search.py (4 steps, 4 prompts, a few seconds each on CPU).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import optuna
import pytest
from rich.console import Console
from typer.testing import CliRunner

from optuna.trial import TrialState
from test_search import MICRO, ROOT, _cmdline_has, pricey_profile, signal_when, trials_of, write_recipe
from tunekit.cli import app
from tunekit.config import apply_overrides, load_raw, load_recipe, validate
from tunekit.config.errors import TunekitError
from tunekit.search import confirm, references, run_search, space
from tunekit.search.answer import quoted_interval
from tunekit.search.view import print_search
from tunekit.search.budget import RESERVED_ATTR
from tunekit.search import storage as studies
from tunekit.search.deadline import Deadline, Deferred, expected_probe_s, never_fits, stopped
from tunekit.search.objective import Objective
from tunekit.search.result import build_result
from tunekit.search.run import _admission
from tunekit.search.setup import make_setup, open_study

runner = CliRunner()
ROUND = {"confirm_top": 1, "confirm_seeds": 2}
"""A confirmation round of the baseline and one candidate (and the references), two seeds each."""
CKPT_REF = {"name": "ckpt-small", "set": ["system.memory.gradient_checkpointing=true", "system.batch.micro_batch_size=2"]}
"""A reference with a key outside the space (checkpointing) and one inside it (the micro-batch)."""
PROBE_TIMEOUT_S, PART_S = 60, 75
"""The search in parts: each probe's limit (room for a probe's start-up on 2 cores shared with another test file's
probes, measured at up to 27 s) and each part's (the first probe's expected timeout and kill grace, 65 s, and the part's
own start-up)."""
SLOW_REF = CKPT_REF | {"set": [*CKPT_REF["set"], "probe.timeout_s=67"]}
"""A reference expected to take 72 s (its timeout and the kill grace) until probed: it fits a part of PART_S seconds
only at its start (a resumed part starts its first probe within 0.3 s), never after the baseline."""


def _search(recipe: Path, out: Path, *extra: str, trials: int = 2) -> list[str]:
    return ["search", "--recipe", str(recipe), "--budget-yuan", "5", "--trials", str(trials), "--out", str(out), *extra]


def _probed(out: Path) -> tuple[list[str], list[tuple[int, int]]]:
    """Run dirs of the study's finished probes (trials, then confirmation probes) and the round's (trial, seed)."""
    saved = json.loads((out / "search.json").read_text())
    trials = [t["run_dir"] for t in saved["trials"] if t["duplicate_of"] is None and t["run_dir"]]
    probes = (saved["confirmation"] or {}).get("probes") or []
    return trials + [p["run_dir"] for p in probes], [(p["trial"], p["seed"]) for p in probes]


def _finished_run_dirs(out: Path) -> list[str]:
    return sorted(str(p.parent.resolve()) for p in (out / "runs").glob("*/summary.json")
                  if not json.loads(p.read_text())["reason"].startswith("abandoned"))


@pytest.fixture(scope="module")
def searched_in_parts(tmp_path_factory):
    """A search with a reference and a confirmation round of two seeds, run in parts of PART_S seconds, each continued
    by --resume: its output directory, each part's stop reason, the last part's result and every part's progress events.

    The first probe is expected to take its timeout and the kill grace, inside the limit with the part's start-up; later
    ones as long as the longest so far, so each part runs a probe or more and stops before one."""
    tmp_path = tmp_path_factory.mktemp("parts")
    recipe = write_recipe(tmp_path, [MICRO], search=ROUND | {"references": [SLOW_REF]}, timeout_s=PROBE_TIMEOUT_S)
    out = tmp_path / "out"
    parts, events, saved_at_stops = [], [], []
    for _ in range(12):
        events.append({"event": "part"})
        res = run_search(load_recipe(str(recipe)), budget_yuan=5, trials=3, out_dir=out, resume=bool(parts),
                         time_limit_s=PART_S, recipe_ref=str(recipe), progress_cb=events.append)
        parts.append(res.stop_reason)
        if not res.stop_reason.startswith("time limit"):
            break
        saved_at_stops.append(json.loads((out / "search.json").read_text()))
    return {"out": out, "parts": parts, "result": res, "events": events, "saved_at_stops": saved_at_stops}


@pytest.mark.slow
def test_time_limit_stops_before_a_probe_resume_repeats_none_and_the_reference_is_quoted(searched_in_parts):
    out, parts = searched_in_parts["out"], searched_in_parts["parts"]
    for saved in searched_in_parts["saved_at_stops"]:
        assert saved["stop_reason"].startswith("time limit: ") and "--resume" in saved["stop_reason"]
        assert saved["resume"].endswith(f"--time-limit {PART_S} --resume") and f"--out {out}" in saved["resume"]
    assert len(parts) > 1 and parts[-1] == "reached 3 trials", parts  # 9 probes do not fit in one part
    saved = json.loads((out / "search.json").read_text())
    assert saved["resume"] is None and saved["best"] is not None and saved["stop_reason"] == "reached 3 trials"
    # the reference did not fit the first part after the baseline: the space's trial ran, the part stopped at its
    # limit naming the reference, and the next part probed it first, with its overrides, never as the answer
    assert "the reference ckpt-small, not probed yet" in parts[0] and "the trials ended (reached 3 trials" in parts[0]
    assert searched_in_parts["saved_at_stops"][0]["references_waiting"] == ["ckpt-small"]
    assert not saved["references_waiting"]
    (ref,) = [t for t in saved["trials"] if t["reference"]]
    (cand,) = saved["confirmation"]["candidates"]
    assert ref["status"] == "ok" and ref["params"] == {MICRO["key"]: 2}
    assert ref["sets"] == [f"{MICRO['key']}=2", "system.memory.gradient_checkpointing=true", "probe.timeout_s=67"]
    trials_by_part: list[list[int]] = []
    for e in searched_in_parts["events"]:
        if e["event"] == "part":
            trials_by_part.append([])
        elif e["event"] == "trial":
            trials_by_part[-1].append(e["number"])
    assert trials_by_part[:2] == [[0, cand], [ref["number"]]], trials_by_part  # a repeat of the baseline probes nothing
    assert saved["best"]["number"] != ref["number"]
    run_dirs, round_ = _probed(out)
    assert saved["confirmation"]["references"] == {"ckpt-small": ref["number"]}
    assert sorted(round_) == sorted([(0, 1), (0, 2), (ref["number"], 1), (ref["number"], 2), (cand, 1), (cand, 2)])
    assert len(set(run_dirs)) == len(run_dirs) == sum(t["duplicate_of"] is None for t in saved["trials"]) + 6
    assert _finished_run_dirs(out) == sorted(run_dirs)  # every probe that ran is one the answer reads, none twice
    assert saved["confirmation"]["verdict"] in ("confirmed", "within noise", "baseline")
    # the answer quotes its saving against the baseline (unless it is the baseline) and the reference, from the
    # round's paired cost ratios: the percent is one minus the ratio, its interval the ratio's
    against = {a["name"]: a for a in saved["reaches"]["against"]}
    assert "ckpt-small" in against and ("the baseline" in against) == (saved["best"]["number"] != 0)
    for a in against.values():
        paired = saved["confirmation"]["paired"][str(a["trial"])][str(saved["best"]["number"])]["cost"]
        assert a["priced"] and a["ratio"] == paired
        assert a["saving_pct"] == pytest.approx(100 * (1 - paired["ratio"]))
        (low, high), _ = quoted_interval(paired)  # the rounds' spread where measured, never narrower than the steps'
        assert a["saving_pct_ci"] == pytest.approx([100 * (1 - high), 100 * (1 - low)])
        assert low <= paired["ci"][0] and paired["ci"][1] <= high
        assert a["text"] in saved["reaches"]["lines"]


@pytest.mark.slow
def test_confirmation_round_alternates_fresh_seeds_and_decides_by_paired_ratios(searched_in_parts):
    out, result, events = searched_in_parts["out"], searched_in_parts["result"], searched_in_parts["events"]
    c = result.confirmation
    (cand,) = [r["number"] for r in result.trials if not r["baseline"] and not r["reference"] and r["duplicate_of"] is None]
    (ref,) = [r["number"] for r in result.trials if r["reference"]]
    assert c is not None and c["baseline"] == 0 and c["candidates"] == [cand] and c["references"] == {"ckpt-small": ref}
    # fresh seeds (the search ran seed 0), every configuration once per seed, the first one rotating: round 0 runs the
    # baseline, the reference, the candidate; round 1 starts one further along
    assert c["seeds"] == [1, 2]
    assert c["order"] == [[0, 1], [ref, 1], [cand, 1], [ref, 2], [cand, 2], [0, 2]]
    assert all(p["status"] == "ok" for p in c["probes"])
    by_trial = {cfg["trial"]: cfg for cfg in c["configurations"]}
    assert sorted(by_trial[cand]["reward_per_seed"]) == ["0", "1", "2"]  # the trial's own probe and the two rounds
    cost = c["ratios_vs_baseline"][str(cand)]["cost"]
    assert len(cost["per_round"]) == 2 and cost["ci"][0] <= cost["ratio"] <= cost["ci"][1]
    assert c["verdict"] in ("confirmed", "within noise", "baseline") and c["sentence"] == result.answer
    assert result.verdict == c["verdict"] and result.best["number"] == c["winner"] in c["named"]
    assert result.answer.startswith(c["final_verdict"])
    # the round-to-round noise: the candidate and the reference over the baseline in two rounds each, 2 df
    assert c["round_spread"]["df"] == 2 and c["round_spread"]["sd_log_ratio"] >= 0
    # the round's table gives the reference's cost ratio against the baseline beside the candidate's
    printed = io.StringIO()
    print_search(Console(file=printed, width=240), result)
    round_table = printed.getvalue().split("confirmation round: seeds", 1)[1]
    ref_row = next(line for line in round_table.splitlines() if line.strip().startswith(f"{ref}r "))
    assert f"{c['paired']['0'][str(ref)]['cost']['ratio']:.3f} [" in ref_row
    # a saving is only claimed when confirmed, and then it is the paired ratio's
    if c["saving_ratio"] is not None:
        assert result.verdict == "confirmed" and c["saving_ratio"] == cost["ratio"] and cost["apart"]
        assert result.saving_pct == pytest.approx(100 * (1 - cost["ratio"]))
    else:
        assert result.saving_yuan is None and result.saving_pct is None
    # the round is paid from the budget and counted in the spend, each probe once over the parts it ran in
    assert c["spent_yuan"] == pytest.approx(sum(p["probe_yuan"] for p in c["probes"])) and c["spent_yuan"] > 0
    assert result.spent_yuan == pytest.approx(sum(r["probe_yuan"] for r in result.trials) + c["spent_yuan"])
    saved = json.loads((out / "search.json").read_text())
    assert saved["confirmation"]["order"] == c["order"] and saved["verdict"] == result.verdict
    assert [e["event"] for e in events].count("confirm") == 6


def test_a_time_limit_no_probe_fits_in_stops_at_once_with_exit_3(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO], timeout_s=60)  # the first probe is expected to take 65 s
    out = tmp_path / "out"
    start = time.monotonic() - 40  # 40 s of a 100 s part spent on a probe already: the next part fits the next one
    with mock.patch("tunekit.search.run.Deadline", lambda limit: Deadline(limit, start, probes=1)):
        res = runner.invoke(app, _search(recipe, out, "--time-limit", "100"))
    assert res.exit_code == 3, res.output
    assert not (out / "runs").exists()
    assert [s for _, s in trials_of(out / "study.db")] == ["WAITING"]  # the baseline, enqueued for the next part
    saved = json.loads((out / "search.json").read_text())
    assert "expected to take 65 s" in saved["stop_reason"] and saved["resume"]
    assert "continue with: tunekit search" in " ".join(res.output.split())


def test_a_time_limit_shorter_than_any_probe_could_take_is_refused(tmp_path):
    """A part that could never start the next probe is bad input, not a stop to resume: the same command would stop
    there again. A new search is refused before anything is written; a resumed one, whose next probe only its
    records can tell, stops with exit 2 naming the limit."""
    recipe = write_recipe(tmp_path, [MICRO], timeout_s=60)
    out = tmp_path / "out"
    res = runner.invoke(app, _search(recipe, out, "--time-limit", "20"))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and not out.exists()
    assert text.startswith("error: --time-limit 20: the search's first probe is expected to take 65 s") and "probe.timeout_s 60" in text
    never = Deadline(20).why_not(65.0)
    assert never_fits(never) and "more than the whole --time-limit 20 s leaves" in never and "--resume" in never
    # 40 s of its 100 s spent before the probe, on nothing but the search's start: the next part would be the same
    assert never_fits(Deadline(100, time.monotonic() - 40).why_not(65.0))
    later = Deadline(100, time.monotonic() - 40, probes=1).why_not(65.0)  # spent on a probe: a fresh part fits it
    assert stopped(later) and not never_fits(later)


def test_a_time_limit_that_is_not_positive_is_exit_2(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, _search(write_recipe(tmp_path, [MICRO]), out, "--time-limit", "0"))
    assert res.exit_code == 2 and "--time-limit 0" in res.output and not out.exists()


class _Study:
    """A new search's study with CKPT_REF among its references, admitted as ``run_search`` admits its trials (three),
    the probes' ends recorded as the objective records them: no probe runs."""

    def __init__(self, tmp_path: Path, *, gpu_profile: str | None = None, budget: float = 200.0,
                 search: dict | None = None) -> None:
        recipe = load_recipe(str(write_recipe(tmp_path, [MICRO], search={"references": [CKPT_REF]} | (search or {}),
                                              timeout_s=PROBE_TIMEOUT_S)))
        self.setup = make_setup(recipe, budget, 3, tmp_path / "out", gpu_profile, "tiny-search.yaml")
        self.study, self.storage = open_study(self.setup, None, "s", False, tmp_path / "out", 0, 3)
        self.objective = Objective(self.setup, self.study, lambda _e: None)

    def admit(self, used_s: float | None, budget: float | None = None) -> str | None:
        """Whether the next trial may start ``used_s`` seconds into a part of PART_S, spent on its probes (None: no
        time limit)."""
        setup = dataclasses.replace(self.setup, budget=budget) if budget is not None else self.setup
        deadline = (Deadline(None) if used_s is None else
                    Deadline(PART_S, start=time.monotonic() - used_s, probes=1 if used_s else 0))
        return _admission(self.study, self.objective, setup, 3, lambda _e: None, deadline)

    def start(self) -> optuna.Trial:
        """The trial Optuna hands out next (the first queued, else a sampled one), admitted to probe."""
        trial = self.study.ask()
        space.suggest(trial, self.setup.base.search.space, self.setup.base_raw)
        trial.set_user_attr(RESERVED_ATTR, self.objective.estimate)
        trial.set_user_attr("runner", self.setup.base.runner)  # what the objective records before the probe
        return trial

    def end(self, trial: optuna.Trial, *, wall_s: float) -> None:
        """``trial``'s probe ended ok after ``wall_s`` seconds, one yuan a second (the pricey profile's price)."""
        for k, v in {"status": "ok", "wall_s": wall_s, "probe_yuan": wall_s, "reward": 0.5, "reward_ci": [0.4, 0.6],
                     "verdict": "feasible"}.items():
            trial.set_user_attr(k, v)
        self.study.tell(trial, 1.0)

    def refs(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("reference")]


def test_a_reference_that_does_not_fit_the_part_waits_while_trials_run_and_goes_first_in_the_next(tmp_path):
    s = _Study(tmp_path)
    assert [(t.user_attrs, t.state) for t in s.study.trials] == [({"baseline": True}, TrialState.WAITING)]
    assert s.admit(0) is None  # the baseline first
    s.end(s.start(), wall_s=20)
    # 25 s into the part the reference (its timeout and the kill grace: 65 s) does not fit; a trial (20 s) does
    assert s.admit(25) is None and not s.refs()
    trial = s.start()
    assert trial.number == 1 and not trial.user_attrs.get("reference")
    s.end(trial, wall_s=20)
    # 50 s in, the trials have ended (three, the reference counted in): it waits for the next part
    why = s.admit(50)
    assert stopped(why) and ("the reference ckpt-small, not probed yet (its timeout and the kill grace), is expected "
                             "to take 65 s and the trials ended (reached 3 trials, 1 of them for the reference not "
                             "probed yet)") in why
    saved = build_result(s.study, s.setup.base, s.setup.base_raw, s.setup.profile, why, tmp_path / "out", None, [])
    assert saved.references_waiting == ["ckpt-small"] and not s.refs()
    assert "against ckpt-small: not probed yet (waiting), not priced" in saved.reaches["lines"]
    # the next part probes it first; another worker admitted while it runs queues it no second time
    assert s.admit(0) is None
    ref = s.start()
    assert ref.number == 2 and ref.params == {MICRO["key"]: 2} and ref.user_attrs["reference"] == "ckpt-small"
    assert ref.user_attrs["reference_sets"] == ["system.memory.gradient_checkpointing=true"]
    assert s.admit(0) == "reached 3 trials (1 still running in other workers)" and len(s.refs()) == 1


def test_the_budget_keeps_a_waiting_reference_s_probe_back_from_the_trials(tmp_path):
    s = _Study(tmp_path, gpu_profile=str(pricey_profile(tmp_path)))  # one yuan a second
    s.end(s.start(), wall_s=20)  # the baseline: 20 yuan; the reference is kept at its 65 s bound, 65 yuan
    # a trial (the median, 20 yuan, and 5 for the kill grace its capped timeout must leave) with the reference's 65
    # kept back passes 109 yuan: the trials end, and the reference, which the time left does not fit, waits for the
    # next part
    why = s.admit(25, budget=109)
    assert stopped(why) and ("and the trials ended (budget: spent 20 of 109 yuan; the next probe (estimated 25 yuan, "
                             "plus 65 kept for the reference ckpt-small, not probed yet, at the probe timeout) would "
                             "pass it)") in why
    # within 111 the trial runs, but its probe may spend only what the reference leaves
    assert s.admit(25, budget=111) is None and not s.refs()
    assert s.objective.keep_back == 65 and s.objective.remaining == pytest.approx(111 - 20 - 65)
    # without a time limit the reference is next, held at its bound
    assert s.admit(None, budget=80) == ("budget: spent 20 of 80 yuan; the probe of the reference ckpt-small at its "
                                       "timeout (estimated 65 yuan) would pass it")
    assert s.admit(None, budget=85) is None and s.objective.estimate == 65 and len(s.refs()) == 1


def test_a_round_without_its_references_keeps_no_budget_back_for_them(tmp_path):
    """The round's reserve counts the references' probes only where the round runs them: the baseline, one
    candidate and the reference, two seeds each, is 6 probes; without the reference, 4."""
    s = _Study(tmp_path, search=ROUND)
    for _ in range(3):  # the baseline, the reference, a trial of the space
        s.admit(None)
        s.end(s.start(), wall_s=20)
    trials = s.study.get_trials(deepcopy=False)
    assert len(s.refs()) == 1 and len(confirm.references_of(trials)) == 1
    assert confirm.probes_needed(s.setup.base.search, trials) == 6
    left_out = s.setup.base.search.model_copy(update={"confirm_references": False})
    assert confirm.probes_needed(left_out, trials) == 4
    assert confirm.probes_needed(left_out, trials, waiting=1) == 4  # nor for one not probed yet


@pytest.mark.slow
def test_a_round_that_leaves_its_references_out_quotes_them_from_single_probes(tmp_path):
    """search.confirm_references false: the round probes the baseline and the candidate only; the saving against
    the reference is its single probe's, without an interval, and the answer says why."""
    temp = {"key": "task.temperature", "type": "float", "low": 0.9, "high": 1.1}  # no sampled trial repeats another
    recipe = write_recipe(tmp_path, [temp], search={"confirm_top": 1, "confirm_seeds": 1, "references": [CKPT_REF],
                                                    "confirm_references": False})
    res = run_search(load_recipe(str(recipe)), budget_yuan=5, trials=3, out_dir=tmp_path / "out",
                     recipe_ref=str(recipe))
    saved = json.loads((tmp_path / "out" / "search.json").read_text())
    (ref,) = [t["number"] for t in saved["trials"] if t["reference"]]
    (cand,) = [t["number"] for t in saved["trials"] if not t["reference"] and not t["baseline"]]
    c = saved["confirmation"]
    assert sorted(map(tuple, c["order"])) == [(0, 1), (cand, 1)] and c["references"] == {}
    assert c["references_left_out"] is True and str(ref) not in c["paired"]
    against = {a["name"]: a for a in saved["reaches"]["against"]}
    a = against["ckpt-small"]
    assert a["trial"] == ref and a["saving_pct_ci"] is None and a["ratio"] is None
    assert "the confirmation round left the references out (search.confirm_references): no interval" in a["text"]
    assert res.stop_reason == "reached 3 trials"


def test_a_study_that_queued_its_references_at_its_creation_resumes_with_them_next(tmp_path):
    s = _Study(tmp_path)
    old = optuna.create_study(storage=s.storage, study_name="old")  # the reference queued behind the baseline
    old.enqueue_trial(s.study.trials[0].params, user_attrs={"baseline": True})
    old.enqueue_trial({MICRO["key"]: 2}, user_attrs={"reference": "ckpt-small",
                                                    "reference_sets": ["system.memory.gradient_checkpointing=true"]})
    s.study, _ = open_study(s.setup, None, "old", True, tmp_path / "out", 0, 3)
    s.objective = Objective(s.setup, s.study, lambda _e: None)
    s.end(s.start(), wall_s=20)
    # a new part: the queued reference is next, at its timeout's bound, and is not queued again
    assert s.admit(0) is None and s.start().user_attrs["reference"] == "ckpt-small" and len(s.refs()) == 1


def test_a_round_probe_that_does_not_fit_waits_while_the_round_s_probes_that_fit_run(tmp_path, monkeypatch):
    s = _Study(tmp_path, search=ROUND, budget=1000.0)
    walls = {}
    for _ in range(3):  # the baseline and a trial of 20 s, the reference (a slower trainer, say) of 80 s
        assert s.admit(None) is None
        trial = s.start()
        walls[trial.number] = 80 if trial.user_attrs.get("reference") else 20
        s.end(trial, wall_s=walls[trial.number])
    ran: list[tuple[int, int]] = []

    def probe(self, t, r, seed, *, partner=False):  # the probe's time passes; it ends ok
        ran.append((t.number, seed))
        self.deadline.start -= walls[t.number]
        self.probes.append({"trial": t.number, "round": r, "seed": seed, "status": "ok", "run_dir": "", "probe_yuan": 0.0,
                            "wall_s": walls[t.number]})
        self._save()
        return True

    monkeypatch.setattr(confirm.Round, "_probe", probe)
    (ref,) = [n for n, w in walls.items() if w == 80]
    (cand,) = [n for n in walls if n not in (0, ref)]

    def part(left_s: float) -> str | None:
        rnd = confirm.Round(s.setup, s.study, lambda _e: None, 100.0, 0.0, Deadline(left_s, start=time.monotonic()))
        rnd.run()
        return rnd.stop

    # 90 s: round 1 (the baseline, the reference, the candidate) and round 2 (starting one further along) without the
    # reference, which does not fit after the first probe; the part stops at its limit naming the wait
    assert stopped(part(90)) and ran == [(0, 1), (cand, 1), (cand, 2), (0, 2)]
    # the next part runs what is left, the reference of each round, as far as its time fits
    ran.clear()
    assert stopped(part(90)) and ran == [(ref, 1)]
    assert sorted((p["trial"], p["seed"]) for p in s.study.user_attrs[confirm.ATTR]["probes"]) == sorted(
        [(0, 1), (0, 2), (cand, 1), (cand, 2), (ref, 1)])


def test_a_round_resumed_on_another_machine_probes_a_seed_s_other_configurations_again_beside_its_probe_there(tmp_path, monkeypatch):
    s = _Study(tmp_path, search=ROUND, budget=1000.0)
    walls = {}
    for _ in range(3):  # the baseline and a trial of 20 s, the reference of 80 s
        assert s.admit(None) is None
        trial = s.start()
        walls[trial.number] = 80 if trial.user_attrs.get("reference") else 20
        s.end(trial, wall_s=walls[trial.number])
    (ref,) = [n for n, w in walls.items() if w == 80]
    (cand,) = [n for n in walls if n not in (0, ref)]
    here = {"machine": "a"}
    ran: list[tuple[int, int, bool]] = []

    def probe(self, t, r, seed, *, partner=False):  # the probe's time passes on this machine; it ends ok
        ran.append((t.number, seed, partner))
        self.deadline.start -= walls[t.number]
        self.probes.append({"trial": t.number, "round": r, "seed": seed, "status": "ok", "run_dir": "", "probe_yuan": 0.0,
                            "wall_s": walls[t.number], "machine": here["machine"]} | ({"partner": True} if partner else {}))
        self._save()
        return True

    decided = []
    monkeypatch.setattr(confirm.Round, "_probe", probe)
    monkeypatch.setattr(confirm, "machine_id", lambda: here["machine"])
    monkeypatch.setattr(confirm, "decide", lambda *a, **k: decided.append(a[4]) or {"probes": a[4]})

    def part(left_s: float, machine: str) -> str | None:
        here["machine"] = machine
        rnd = confirm.Round(s.setup, s.study, lambda _e: None, 100.0, 0.0, Deadline(left_s, start=time.monotonic()))
        rnd.run()
        return rnd.stop

    # machine a: every probe but the reference's, as when the machine does not change
    assert stopped(part(90, "a")) and ran == [(0, 1, False), (cand, 1, False), (cand, 2, False), (0, 2, False)]
    # machine b, 90 s: the reference of seed 1 (80 s); the baseline and the candidate of seed 1 again beside it do not
    # fit the 10 s left, nor does the reference of seed 2: they wait
    ran.clear()
    why = part(90, "b")
    assert stopped(why) and ran == [(ref, 1, False)]
    assert "the probe of trial 0 at seed 1 again on this machine is expected to take 20 s" in why
    # b again, 300 s: seed 1's partners, then the reference of seed 2 and its partners; the round decides from every
    # probe, machine a's kept
    ran.clear()
    assert part(300, "b") is None and ran == [(0, 1, True), (cand, 1, True), (ref, 2, False), (0, 2, True), (cand, 2, True)]
    (probes,) = decided
    on = sorted((p["trial"], p["seed"], p["machine"]) for p in probes)
    assert on == sorted([(n, seed, m) for seed in (1, 2) for n, m in ((0, "a"), (cand, "a"), (0, "b"), (cand, "b"), (ref, "b"))])
    # a part on a third machine, where no probe of a seed ran, has nothing to pair: it decides at once
    decided.clear()
    ran.clear()
    assert part(300, "c") is None and ran == [] and len(decided) == 1


def _done(number: int, wall_s: float, *, runner: str | None = None, sampled: str | None = None,
          reference: str | None = None) -> optuna.trial.FrozenTrial:
    """A finished trial whose probe took ``wall_s``: its runner recorded (``runner``), or only sampled (``sampled``,
    as an older study's trial)."""
    attrs = {"wall_s": wall_s} | ({"runner": runner} if runner else {}) | ({"reference": reference} if reference else {})
    t = optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs,
                                  params={"runner": sampled} if sampled else {},
                                  distributions={"runner": optuna.distributions.CategoricalDistribution(
                                      ["builtin", "trl"])} if sampled else {})
    t.number = number
    return t


def test_a_trial_is_expected_to_take_what_its_runner_s_probes_took():
    builtin, trl = _done(0, 260.0, runner="builtin"), _done(1, 488.0, runner="trl")
    older = _done(2, 250.0, sampled="builtin")  # an older study's trial: its runner read off its params
    assert expected_probe_s([builtin, trl, older], [], 500) == 488.0  # no runner said: the longest
    assert expected_probe_s([builtin, trl, older], [], 500, runners=["builtin"]) == 260.0
    assert expected_probe_s([trl, older], [], 500, runners=["builtin"]) == 250.0
    assert expected_probe_s([builtin, trl], [{"trial": 0, "wall_s": 300.0}], 500, runners=["builtin"]) == 300.0
    # before the sampler chooses: the quickest runner's; a runner no probe ran: its bound, not another runner's
    # probe (a first TRL trial expected to take the builtin trainer's 200 s ran past its part)
    assert expected_probe_s([builtin, trl], [], 500, runners=["builtin", "trl"]) == 260.0
    assert expected_probe_s([builtin, trl], [], 500, runners=["verl"]) == 505.0
    assert expected_probe_s([builtin], [], 500, runners=["builtin", "trl"]) == 260.0
    assert expected_probe_s([builtin], [], 500, runners=["trl"]) == 505.0
    reference = _done(3, 1100.0, runner="trl", reference="trl-defaults")
    assert expected_probe_s([builtin, trl, reference], [], 1300, runners=["trl"]) == 488.0
    # a runner only a reference ran: the reference's probe, not the other runner's (a TRL trial expected to take
    # the builtin trainer's 217 s ran past its part); never more than the probe's own bound
    assert expected_probe_s([builtin, reference], [], 1300, runners=["trl"]) == 1100.0
    assert expected_probe_s([builtin, reference], [], 1300, runners=["builtin", "trl"]) == 260.0
    assert expected_probe_s([builtin, reference], [], 500, runners=["trl"]) == 505.0
    assert expected_probe_s([], [], 500, runners=["builtin"]) > 500  # nothing finished: the timeout bounds it



def test_a_trial_is_expected_to_take_its_runner_s_probe_rescaled_by_the_cost_model(tmp_path):
    """A finished probe's steps are rescaled to a sampled trial's knobs by the cost model's step ratio, its one-time
    part kept: a micro-batch a quarter as large (four times the eager passes) is expected to take longer than the
    probe did, the probe's own knobs give its wall time back, and a probe of another runner, a reference or records
    gone say nothing."""
    from tunekit.estimate.profiles import load_profile
    from tunekit.rundir import write_config
    from tunekit.search.deadline import scaled_probe_s

    h200 = load_profile("h200")
    eager = ["system.device=cuda", "system.compile=false", "system.cuda_graphs=false"]
    probed = load_recipe("qwen2.5-0.5b", [*eager, "system.batch.micro_batch_size=32"])
    run = tmp_path / "p0"
    run.mkdir()
    write_config(run, probed)
    (run / "summary.json").write_text(json.dumps({"status": "ok", "wall_s": 300.0, "steps": 20,
                                                  "steady": {"timing_s/step": 10.0}}))

    def finished(number: int, **attrs) -> optuna.trial.FrozenTrial:
        t = optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0,
                                      user_attrs={"status": "ok", "run_dir": str(run), "runner": "builtin"} | attrs)
        t.number = number
        return t

    same = scaled_probe_s(probed, [finished(0)], h200)
    assert same == pytest.approx(300.0)  # 100 s one-time and 20 steps of 10 s, as it ran
    smaller = scaled_probe_s(load_recipe("qwen2.5-0.5b", [*eager, "system.batch.micro_batch_size=8"]), [finished(0)], h200)
    assert smaller > 2 * 300.0  # four times the eager passes a step: steps several times as long
    larger = scaled_probe_s(load_recipe("qwen2.5-0.5b", [*eager, "system.batch.micro_batch_size=64"]), [finished(0)], h200)
    assert 100.0 < larger < 300.0  # fewer passes: shorter steps, never below the one-time part
    assert scaled_probe_s(probed, [finished(0, runner="trl"), finished(1, reference="trl-defaults")], h200) is None
    assert scaled_probe_s(probed, [finished(0, run_dir=str(tmp_path / "gone"))], h200) is None
    assert scaled_probe_s(probed, [finished(0), finished(1, run_dir=str(tmp_path / "gone"))], h200) == same

def test_a_sampled_trial_whose_runner_does_not_fit_is_deferred_to_the_next_part(tmp_path):
    s = _Study(tmp_path)
    for wall_s in (20, 50):  # the baseline, then a trial; both ran the recipe's runner
        trial = s.start()
        trial.set_user_attr("runner", "builtin")
        s.end(trial, wall_s=wall_s)
    trials, recipe = s.study.get_trials(deepcopy=False), s.setup.base
    s.objective.deadline = Deadline(PART_S, start=time.monotonic() - 30)  # 45 s left: the builtin's 50 s do not fit
    trial = s.study.ask()
    with pytest.raises(Deferred) as deferred:
        s.objective._fits(trial, recipe, trials)
    assert stopped(deferred.value.reason) and "trial 2's probe (builtin) is expected to take 50 s" in (
        deferred.value.reason)
    s.study.tell(trial, state=TrialState.FAIL)
    (failed,) = s.study.get_trials(states=(TrialState.FAIL,))
    assert failed.user_attrs["status"] == "deferred" and "deferred to the next part" in failed.user_attrs["reason"]
    # the next part probes the same configuration first
    assert studies.recover(s.study, s.storage) == [2]
    (queued,) = s.study.get_trials(states=(TrialState.WAITING,))
    assert queued.params == failed.params and queued.user_attrs["retry_of"] == 2
    # with room for it it runs, and where another runner's probe was the long one
    s.objective.deadline = Deadline(PART_S, start=time.monotonic() - 20)
    s.objective._fits(s.study.ask(), recipe, trials)
    s.objective.deadline = Deadline(PART_S, start=time.monotonic() - 30)
    s.objective._fits(s.study.ask(), recipe, [trials[0], _done(1, 50.0, runner="trl")])


@pytest.mark.slow
def test_sigterm_during_a_confirmation_probe_reprobes_only_that_one_on_resume(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO], search={"confirm_top": 1, "confirm_seeds": 1}, name="termme")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tunekit", *_search(recipe, out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    runs: list[Path] = []

    def second_round_probe_under_way() -> bool:  # the round's first probe done, its second under way
        runs[:] = sorted((out / "runs").glob("*-c*-t*")) if (out / "runs").is_dir() else []
        return len(runs) == 2 and (runs[-1] / "steps.jsonl").exists()

    assert signal_when(proc, second_round_probe_under_way, signal.SIGTERM, "the round's second probe") == 130
    study = optuna.load_study(study_name="termme", storage=f"sqlite:///{out / 'study.db'}")
    kept = study.user_attrs["confirmation"]
    assert kept["running"] and len(kept["probes"]) == 1
    # the stopped probe's seconds are spent too, though it left no result: more than the finished probe alone
    assert study.user_attrs["confirmation_spent_yuan"] > kept["probes"][0]["probe_yuan"] > 0
    stopped = next(d for d in runs if str(d.resolve()) != kept["probes"][0]["run_dir"])
    assert json.loads((stopped / "summary.json").read_text())["reason"].startswith("abandoned")
    assert study.user_attrs.get("confirmation_claim") is None  # free for the resumed search, on any host

    res = runner.invoke(app, [*args[3:], "--resume"])  # the resume in this process: the stopped one's state is on disk
    assert res.exit_code == 0, res.output[-2000:]
    run_dirs, round_ = _probed(out)
    assert len(round_) == len(set(round_)) == 2 and kept["probes"][0]["run_dir"] in run_dirs
    assert len(set(run_dirs)) == len(run_dirs) == 4
    assert _finished_run_dirs(out) == sorted(run_dirs)  # the stopped probe ran again, the finished one did not
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline_has(p, str(stopped.resolve()))]



@pytest.mark.parametrize(("refs", "needle"), [
    ([{"name": "a", "set": ["runner=trl"]}, {"name": "a", "set": []}], "search.references[1] a: the name appears twice"),
    ([{"name": "a", "set": ["system.batch.micro_size=2"]}], "search.references[0] a set 'system.batch.micro_size': no such key"),
    ([{"name": "a", "set": ["system.batch.micro_batch_size=1"]}], "value 1 is not among the choices; add it so the reference a can be enqueued"),
    ([{"name": "a", "set": ["search.confirm_top=0"]}], "a reference cannot change the search section"),
    ([{"name": "a", "set": ["runner=trl"], "sett": []}], "sett"),
])
def test_a_bad_reference_is_one_sentence_naming_the_file_exit_2_and_creates_nothing(tmp_path, refs, needle):
    recipe = write_recipe(tmp_path, [MICRO], search={"references": refs})
    out = tmp_path / "out"
    res = runner.invoke(app, _search(recipe, out, trials=4))
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert needle in text and str(recipe) in text.replace(" ", "")
    assert res.output.count("error:") == 1 and not out.exists()


def test_references_need_room_for_a_trial_of_the_search_own(tmp_path):
    recipe = write_recipe(tmp_path, [MICRO], search={"references": [CKPT_REF]})
    res = runner.invoke(app, _search(recipe, tmp_path / "out", trials=2))
    assert res.exit_code == 2 and "--trials 3 or more" in " ".join(res.output.split())


def test_the_smollm2_recipe_searches_a_space_every_runner_accepts_and_prices_trl_defaults():
    """Every configuration of recipes/smollm2-arith.yaml's space, and its reference, is a valid recipe its runner
    accepts on one GPU (checked without one), so no trial of the GPU search is refused before it probes."""
    from tunekit.runners import runner_for
    from tunekit.search import space
    from tunekit.search.checks import check_arguments

    recipe = load_recipe("smollm2-arith")
    check_arguments(recipe, 80, 10, "recipes/smollm2-arith.yaml")
    raw, s = recipe.model_dump(mode="json"), recipe.search
    assert s.probe_steps == 50 and (s.confirm_top, s.confirm_seeds) == (1, 2)
    configs = [space.overrides(p) for p in space.grid(s.space, raw)]
    (ref,) = s.references
    params, rest = space.reference_trial(ref, raw, s.space, "smollm2-arith")
    configs.append(space.overrides(params) + rest)
    runners, file_raw = set(), load_raw("smollm2-arith")[0]  # the file read once: load_recipe without the read
    for sets in configs:
        r = validate(apply_overrides(file_raw, sets), f"smollm2-arith with {sets}")
        runner_for(r).check(r, cuda_count=1)
        runners.add(r.runner)
    assert runners == {"builtin", "trl"} and len(configs) > 50
    trl = load_recipe("smollm2-arith", configs[-1])
    # TRL's GRPOConfig defaults where tunekit's differ, the workload kept
    assert (trl.runner, trl.algorithm.actor_lr, trl.system.batch.micro_batch_size, trl.system.batch.mini_batch) == ("trl", 1e-6, 8, 8)
    assert trl.system.memory.gradient_checkpointing and trl.system.rollout.gpu_memory_utilization == 0.3
    assert (trl.system.batch.prompts_per_step, trl.system.batch.samples_per_prompt, trl.task.max_new_tokens) == (64, 8, 32)


def test_a_probe_that_compiled_cold_is_expected_back_without_the_compile_its_cache_now_saves():
    from tunekit.search.deadline import expected_probe_s, warm_wall_s

    cold = {"wall_s": 310.0, "compile/backend_s": 142.0, "compile_cache/hits": 0, "compile_cache/misses": 12}
    partial = {"wall_s": 200.0, "compile/backend_s": 40.0, "compile_cache/hits": 3, "compile_cache/misses": 1}
    warm = {"wall_s": 150.0, "compile/backend_s": 8.0, "compile_cache/hits": 9, "compile_cache/misses": 0}
    assert warm_wall_s(cold) == pytest.approx(168.0)
    assert warm_wall_s(partial) == pytest.approx(190.0)   # a quarter of the lookups missed: 10 of the 40 s
    assert warm_wall_s(warm) == 150.0 and warm_wall_s({"wall_s": 90.0}) == 90.0 and warm_wall_s({}) is None
    uncompiled = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0,
                                           user_attrs={"wall_s": 240.0, "warm_wall_s": 240.0})
    compiled = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0,
                                         user_attrs={"wall_s": 310.0, "warm_wall_s": 168.0})
    older = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0, user_attrs={"wall_s": 130.0})
    assert expected_probe_s([compiled, older], [], 500) == 168.0
    assert expected_probe_s([compiled], [{"wall_s": 250.0, "warm_wall_s": 180.0}], 500) == 180.0
    assert expected_probe_s([compiled, uncompiled], [], 500) == 240.0
    assert expected_probe_s([], [{"wall_s": None}], 500) > 500
    # a reference that ran a slower trainer's defaults says little of the space's next trial; a confirmation probe
    # is expected to take what its own trial's probes took
    reference = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=2.0,
                                          user_attrs={"wall_s": 500.0, "reference": "trl-defaults"})
    reference.number, compiled.number, uncompiled.number = 1, 0, 2
    assert expected_probe_s([compiled, reference], [], 500) == 168.0
    assert expected_probe_s([reference], [], 900) == 500.0
    assert expected_probe_s([compiled, reference, uncompiled], [], 500, of=reference) == 500.0
    assert expected_probe_s([compiled, reference], [{"trial": 0, "wall_s": 175.0}, {"trial": 1, "wall_s": 520.0}],
                            500, of=compiled) == 175.0
    assert expected_probe_s([compiled, reference], [{"trial": 1, "wall_s": 520.0}], 500) == 168.0
    waiting = optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, user_attrs={"reference": "slow"})
    waiting.number = 3  # a reference not probed yet: its timeout bounds it, the space's probes say nothing of it
    assert expected_probe_s([compiled, reference, waiting], [], 500, of=waiting) > 500


def test_a_resumed_study_keeps_the_search_keys_its_trials_were_judged_by_and_may_grow_its_round(tmp_path):
    path = write_recipe(tmp_path, [MICRO], timeout_s=PROBE_TIMEOUT_S)
    out = tmp_path / "out"

    def opened(sets: list[str], resume: bool):
        setup = make_setup(load_recipe(str(path), sets), 200.0, 3, out, None, "tiny-search.yaml")
        return open_study(setup, None, "s", resume, out, 0, 3)

    opened([], False)
    with pytest.raises(TunekitError) as e:
        opened(["search.reward_threshold=0.3"], True)
    assert e.value.message.startswith("--resume: search.reward_threshold in tiny-search.yaml is 0.3 but 0.0 in study 's'")
    with pytest.raises(TunekitError, match="search.space in tiny-search.yaml differs from that of study 's'"):
        opened(["search.space=[{key: system.batch.micro_batch_size, type: categorical, choices: [2, 4, 8]}]"], True)
    study, _ = opened(["search.confirm_seeds=5"], True)  # more seeds for the round: the same study goes on
    assert study.user_attrs["search_keys"]["reward_threshold"] == 0.0


def test_the_next_probe_is_estimated_from_whole_probes_so_a_cut_short_one_does_not_shrink_it():
    """Near the end of a budget a probe's timeout is capped by the money left; one cut short there (or one that
    crashed) spent little, and counting it would admit the next probe with a still shorter cap."""
    from tunekit.estimate.profiles import load_profile
    from tunekit.search.budget import KILL_GRACE_S, admitted_at, estimate_next, grace_yuan

    def done(status: str, yuan: float) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(value=1.0, user_attrs={"status": status, "probe_yuan": yuan})

    trials = [done("ok", 10.0), done("ok", 12.0), done("timeout", 2.0), done("timeout", 1.0), done("failed", 0.5)]
    assert estimate_next(trials, first=99.0) == 11.0  # the two whole probes' median, not 2.0 over all five
    assert estimate_next(trials[2:], first=99.0) == 1.0  # none whole yet: every probe's
    assert estimate_next([], first=99.0) == 99.0
    cpu = load_profile("cpu")  # 0.5 yuan a device-hour
    assert KILL_GRACE_S == 5.0 and grace_yuan(2, cpu) == pytest.approx(5 / 3600)  # 2 devices x 5 s at 0.5 yuan an hour
    # admitted with room for the grace once measured; the first probe's estimate (its timeout and the grace) as it is
    assert admitted_at(trials, 99.0, 2, cpu) == pytest.approx(11.0 + 5 / 3600)
    assert admitted_at([], 99.0, 2, cpu) == 99.0


@pytest.mark.slow  # the baseline's probe, then a stop: about 15 s
def test_a_trial_stopped_before_its_first_step_still_counts_what_it_ran(tmp_path, monkeypatch):
    """A probe stopped during its start-up leaves no run directory (no step to keep), so its seconds are recorded
    with the trial when the stop comes: a GPU start-up of minutes is spent, though it is probed again."""
    from tunekit.search import objective

    real = objective.launch_probe

    def starts_then_stopped(plan, **kwargs):
        if not kwargs["run_id"].endswith("-t0"):  # the baseline runs; the next probe is stopped 1 s into its start
            time.sleep(1.0)
            raise KeyboardInterrupt
        return real(plan, **kwargs)

    monkeypatch.setattr(objective, "launch_probe", starts_then_stopped)
    recipe = write_recipe(tmp_path, [MICRO], name="startstop")
    out = tmp_path / "out"
    res = runner.invoke(app, _search(recipe, out))
    assert res.exit_code == 130, res.output[-2000:]
    trials = optuna.load_study(study_name="startstop", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    (stopped,) = [t for t in trials if t.state == TrialState.FAIL]  # the other configuration than the baseline's
    # at least the second it ran, on one CPU device at 0.5 yuan an hour
    assert stopped.user_attrs["probe_yuan"] >= 1.0 / 3600 * 0.5
    row = next(r for r in json.loads((out / "search.json").read_text())["trials"] if r["number"] == stopped.number)
    assert (row["status"], row["reason"]) == ("stopped", "stopped before its end; --resume probes it again")


def test_a_seeded_search_proposes_the_same_configurations_in_the_same_order(tmp_path, monkeypatch):
    """--seed seeds Optuna's sampler: a search run again proposes what it proposed (probes are stood in for by a
    quick refusal, so only the proposals are compared)."""
    from test_search import CKPT, TEMP

    from tunekit.search import objective

    def refused(plan, **kwargs):
        raise TunekitError("stood in for")

    monkeypatch.setattr(objective, "launch_probe", refused)
    recipe = write_recipe(tmp_path, [MICRO, TEMP, CKPT], name="seeded")

    def proposals(out: str, *seed: str) -> list[dict]:
        res = runner.invoke(app, _search(recipe, tmp_path / out, *seed, trials=6))
        assert res.exit_code == 1, res.output[-2000:]  # nothing reaches the threshold: every probe was refused
        study = optuna.load_study(study_name="seeded", storage=f"sqlite:///{tmp_path / out / 'study.db'}")
        return [t.params for t in study.get_trials()]

    first = proposals("a", "--seed", "7")
    assert len(first) >= 6 and first == proposals("b", "--seed", "7")
    assert proposals("c", "--seed", "8") != first
    # the line that would continue it keeps its seed
    from tunekit.search.run import resume_command
    again = resume_command(ref="r.yaml", sets=[], budget_yuan=5, trials=6, out_dir=tmp_path, study="s", storage=None,
                           time_limit_s=540, seed=7)
    assert again.endswith("--time-limit 540 --seed 7 --resume")


def test_with_every_probe_timed_out_the_skipped_round_says_the_baseline_has_no_probe():
    timed_out = [optuna.trial.create_trial(value=float("inf"), user_attrs={"baseline": n == 0, "status": "timeout"})
                 for n in range(3)]
    for n, t in enumerate(timed_out):
        t.number = n
    assert confirm.nothing_to_confirm(timed_out, 2) == ("no confirmation round: the baseline has no finished probe to "
                                                        "confirm a trial against")
