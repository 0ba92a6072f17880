"""The search's answer on recorded studies: one rule for "reaches the threshold" in the answer, search.json, the
progress bar and the report's headline; one reward per configuration; what the search cost and when it pays."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from rich.console import Console
from search_record import MICRO, probe, record, result_of

from tunekit.report import build_report, data
from tunekit.report.load import load_records
from tunekit.search.answer import compare, so_far
from tunekit.search.budget import best_feasible
from tunekit.search.view import print_search

THR = 0.4


def printed(res) -> str:
    out = io.StringIO()
    print_search(Console(file=out, width=400, color_system=None), res)
    return out.getvalue()


def test_an_interval_at_or_above_the_threshold_reaches_it_and_one_below_is_never_the_answer(tmp_path):
    study = record(tmp_path / "s.db", [
        probe(0.46, 0.43, 0.49, 3.0, micro=1, baseline=True),
        probe(0.25, 0.20, 0.30, 1.0, micro=2),   # the cheapest, below the threshold
        probe(0.41, 0.38, 0.44, 1.5, micro=4),   # straddles it
        probe(0.45, 0.40, 0.50, 2.0, micro=8),   # low end at the threshold: reaches it
    ], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 3 and res.reaches["verdict"] == "feasible"
    assert res.reaches["title"] == "Cheapest configuration that reaches the threshold: trial 3"
    saved = json.loads(res.json_path.read_text())
    assert saved["reaches"]["trial"] == 3 and saved["best"]["number"] == 3
    assert "trial 3 reaches the threshold 0.4: reward 0.450 [0.400, 0.500] (single probe, seed 0)" in printed(res)
    # the progress bar and the pruning bound read the same rule: the straddling trial 2 is not "feasible"
    assert so_far(res.trials, threshold=THR, seed=0) == "trial 3, 2 yuan, reaches the threshold"
    assert best_feasible(study.get_trials()) == 2.0
    # the answer after each trial, as search.json keeps it for the report's history: trial 2's straddle never moves it
    assert [t["best_so_far"] for t in saved["trials"]] == [3.0, 3.0, 3.0, 2.0]


def test_a_straddling_interval_reaches_it_within_noise_and_says_what_more_seeds_would_settle_it(tmp_path):
    study = record(tmp_path / "s.db", [
        probe(0.30, 0.25, 0.35, 3.0, micro=1, baseline=True),
        probe(0.405, 0.38, 0.43, 1.5, micro=4),
    ], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.reaches["verdict"] == "within noise" and res.best["number"] == 1
    assert res.reaches["title"] == "Cheapest configuration that reaches the threshold within noise: trial 1"
    # half width 0.025 over a gap of 0.005 from one seed: 1 x (0.025 / 0.005)^2 = 25 seeds; the round (not run) with
    # 24 fresh seeds of the answer's and the baseline's probes, 0.5 yuan each
    assert ("about 25 seeds in all would settle it if its mean holds (the confirmation round has not finished: the "
            "same command with --resume --set search.confirm_seeds=24 runs it with 24 fresh seeds, about 24 yuan in "
            "probes; it has 1)") in printed(res)
    assert so_far(res.trials, threshold=THR, seed=0) == "trial 1, 1.5 yuan, reaches the threshold within noise"
    # the baseline as the answer, the other trial infeasible: no round will run, so no command to run one is offered
    alone = record(tmp_path / "b.db", [probe(0.405, 0.38, 0.43, 1.0, micro=1, baseline=True),
                                       probe(0.30, 0.25, 0.35, 3.0, micro=4)], threshold=THR)
    res_b = result_of(alone, tmp_path / "out-b", threshold=THR)
    assert res_b.reaches["trial"] == 0
    assert res_b.reaches["settle"] == ("about 25 seeds in all would settle it if its mean holds; but no confirmation "
                                       "round: no trial but the baseline is feasible or within noise, nothing to "
                                       "confirm it against")
    # with three fresh seeds asked for, the round is priced at three, never offered with fewer
    res_3 = result_of(record(tmp_path / "c.db", [probe(0.30, 0.25, 0.35, 3.0, micro=1, baseline=True),
                                                 probe(0.43, 0.38, 0.48, 1.5, micro=4)], threshold=THR),
                      tmp_path / "out-3", threshold=THR, sets=["search.confirm_seeds=3"])
    assert "the same command with --resume runs it with 3 fresh seeds, about 3 yuan in probes" in res_3.reaches["settle"]
    assert best_feasible(study.get_trials()) is None
    # the report's history draws that answer too, read from search.json: a within-noise answer is the answer so far
    import pandas as pd

    from tunekit.report import headline
    from tunekit.report.load import Records
    records = Records(probes=[], searches=[json.loads(res.json_path.read_text())])
    hist = headline.search_history(records, pd.DataFrame())["trials"]
    assert hist["best_so_far"].tolist()[1:] == [1.5] and hist["best_so_far"].isna().tolist()[0]
    assert hist["category"].tolist()[1] == "within noise"
    text = printed(res)
    # a mean 0.001 under the threshold (a SmolLM2 search's 0.699 against 0.7) needs 941 seeds: no advice to follow
    from tunekit.search.answer import Reward, settle
    close = settle(Reward(0.698828125, 0.6656201171875, 0.7375, [0], confirmed=False), 0.7)
    assert "seeds in all would settle" not in close and "would take about 941 seeds" in close
    assert close.startswith("its mean is 0.00117 below the threshold, 3% of the interval's half-width")
    assert "within noise: within noise" not in text and "within noise (within noise" not in text
    # a reward taken from an earlier trial of the same learning: the round probes this configuration, so its own
    # reading says how many seeds (0.728 against 0.7, half width 0.031: 2)
    borrowed = settle(Reward(0.708, 0.679, 0.742, [0], False, learning_of=0, own=0.728), 0.7)
    assert borrowed.startswith("about 2 seeds in all would settle it if its mean (its own reading 0.728) holds")
    # before the round: never fewer fresh seeds than it runs (2 by default), priced as the whole round; more where
    # the interval asks for more (0.72 against 0.7, half width 0.04 over one seed: 4 in all, 3 fresh)
    before = settle(Reward(0.708, 0.679, 0.742, [0], False, learning_of=0, own=0.728), 0.7, 0.5, planned=2)
    assert "search.confirm_seeds" not in before and "runs it with 2 fresh seeds, about 1 yuan in probes" in before
    assert "the confirmation round has not finished" in before
    wide = settle(Reward(0.72, 0.68, 0.76, [0], False), 0.7, 0.5, planned=2)
    assert wide.startswith("about 4 seeds in all") and "--resume --set search.confirm_seeds=3 runs it with 3 fresh seeds, about 1.5 yuan" in wide


def test_when_nothing_reaches_it_the_answer_names_the_closest_its_shortfall_and_what_to_change(tmp_path):
    study = record(tmp_path / "s.db", [
        probe(0.30, 0.25, 0.35, 3.0, micro=1, baseline=True),
        probe(0.36, 0.33, 0.385, 1.5, micro=4),
        probe(0.10, 0.05, 0.15, 1.0, micro=8),
        probe(0.0, 0.0, 0.0, 0.0, micro=16, status="oom"),
    ], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR, reason="budget: spent 9 of 10 yuan")
    assert res.best is None and res.reaches["trial"] is None and res.verdict == "none"
    c = res.reaches["closest"]
    assert c["trial"] == 1 and abs(c["shortfall"] - 0.04) < 1e-12
    line = res.reaches["lines"][0]
    assert line.startswith("no configuration reaches the threshold 0.4; the closest is trial 1, reward 0.360 [0.330, 0.385]")
    assert "0.040 short" in line and "lower the threshold to 0.33" in line and "probe.steps=" in line and "--budget-yuan" in line
    assert res.reaches["title"] == "No configuration reaches the threshold 0.4"


CONFIRMED = {  # a confirmation round over seeds 0 (the trials' own probes), 1 and 2
    "candidates": [1, 2], "baseline": 0, "seeds": [1, 2], "probes": [], "spent_yuan": 3.0, "cut_short": None,
    "configurations": [
        {"trial": 0, "baseline": True, "sets": [], "seeds": [0, 1, 2], "reward": 0.47, "reward_ci": [0.45, 0.49],
         "reward_per_seed": {"0": 0.47, "1": 0.46, "2": 0.48},
         "verdict": "feasible", "projected_steps": 100},
        {"trial": 1, "baseline": False, "sets": [], "seeds": [0, 1, 2], "reward": 0.407, "reward_ci": [0.401, 0.413],
         "reward_per_seed": {"0": 0.391, "1": 0.415, "2": 0.415},
         "verdict": "feasible", "projected_steps": 100},
        {"trial": 2, "baseline": False, "sets": [], "seeds": [0, 1, 2], "reward": 0.35, "reward_ci": [0.33, 0.37],
         "reward_per_seed": {"0": 0.43, "1": 0.31, "2": 0.31},
         "verdict": "infeasible", "projected_steps": 100},
    ],
    "ratios_vs_baseline": {}, "round_spread": None, "top_two": None,
    "winner": 1, "named": [1], "verdict": "confirmed", "final_verdict": "confirmed: trial 1",
    "sentence": "confirmed: trial 1: it costs 0.5x the baseline's", "saving_ratio": 0.5,
}


def test_after_a_confirmation_round_the_answer_quotes_its_reward_over_the_seeds_it_names(tmp_path):
    study = record(tmp_path / "s.db", [
        probe(0.47, 0.45, 0.49, 2.0, micro=1, baseline=True, spend=1.0),
        probe(0.391, 0.365, 0.417, 1.0, micro=4, spend=1.0),   # its own probe straddles the threshold
        probe(0.43, 0.41, 0.45, 0.8, micro=8, spend=1.0),
    ], threshold=THR, confirmation=CONFIRMED, spent_confirming=3.0)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 1 and res.verdict == "confirmed"
    r = res.reaches
    assert r["verdict"] == "feasible" and r["reward"]["confirmed"] and r["reward"]["seeds"] == [0, 1, 2]
    text = printed(res)
    assert "trial 1 reaches the threshold 0.4: reward 0.407 [0.401, 0.413] over seeds 0, 1, 2" in text
    assert "0.391" not in text.split("answer:")[1]  # the single probe's figure stays in the trials table
    # spent: three probes (3 yuan) and the round (3 yuan); saving: half the baseline's 2 yuan = 1 yuan a run
    assert res.spent_yuan == 6.0 and res.saving_yuan == 1.0 and r["payback_runs"] == 6
    assert "the search itself cost 6 yuan in probes; the saving of 1 yuan a run pays for it after 6 full run(s)" in text


def test_two_configurations_the_round_could_not_tell_apart_are_one_line_of_the_answer_every_view_prints(tmp_path):
    """The round names the answer and the baseline, their costs within noise: the answer's lines (which the CLI and
    the report both print) say so with the paired ratio and each round's, read the answer's way round."""
    cost = {"ratio": 2.0, "ci": [1.6, 2.4], "noise_ci": [0.5, 8.0], "per_round": [5.53, 2.1], "apart": False, "why": "w"}
    tied = json.loads(json.dumps(CONFIRMED)) | {
        "winner": 1, "named": [1, 0], "verdict": "within noise", "final_verdict": "within noise: trials 1 and 0",
        "sentence": "within noise: trials 1 and 0", "saving_ratio": None, "ratios_vs_baseline": {"1": {"cost": cost}}}
    study = record(tmp_path / "s.db", [
        probe(0.47, 0.45, 0.49, 2.0, micro=1, baseline=True),
        probe(0.391, 0.365, 0.417, 1.0, micro=4),
    ], threshold=THR, confirmation=tied)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 1
    line = ("the confirmation round could not tell trial 1's cost from trial 0's: side by side it costs 2.000x "
            "[0.500, 8.000] of it (the interval from how far the rounds' ratios move; per round 5.53x, 2.1x)")
    assert line in res.reaches["lines"]
    # the baseline's way round: one over the ratio, its intervals and rounds with it
    from tunekit.search.answer import _paired
    back = _paired(tied, 0, 1)
    assert back["ratio"] == 0.5 and back["ci"] == [1 / 2.4, 1 / 1.6] and back["noise_ci"] == [1 / 8.0, 2.0]
    assert back["per_round"] == pytest.approx([1 / 5.53, 1 / 2.1])


def test_a_tie_between_two_candidates_is_read_the_answer_s_way_round():
    """The round's top two are its first over its second; an answer that is the second reads one over it."""
    from tunekit.search.answer import _tied

    top = {"trials": [3, 2], "ratio": 0.8, "ci": [0.7, 0.9], "noise_ci": None, "per_round": [0.75, 0.85]}
    section = {"baseline": 0, "named": [3, 2], "top_two": top, "ratios_vs_baseline": {}}
    assert _tied(section, 3) == {"trial": 2, "ratio": top}
    other = _tied(section, 2)
    assert other["trial"] == 3 and other["ratio"]["ratio"] == 1.25 and other["ratio"]["ci"] == [1 / 0.9, 1 / 0.7]
    assert _tied(section | {"named": [3]}, 3) is None  # one configuration named: no tie


def test_a_reference_the_round_left_out_is_priced_against_the_answer_s_own_single_probe():
    """Like with like: where the round left the references out, the saving against one sets the answer's single
    probe, not its round projection, against the reference's single probe."""
    from tunekit.search.answer import compare

    row = {"number": 1, "status": "ok", "projected_yuan": 1.0, "reward": 0.45, "reward_ci": [0.42, 0.48],
           "probe_yuan": 0.5, "seeds": [0]}
    ref = {"number": 2, "status": "ok", "reference": "trl-defaults", "projected_yuan": 4.0, "reward": 0.45,
           "reward_ci": [0.42, 0.48], "probe_yuan": 2.0}
    section = {"references_left_out": True, "baseline": 0, "configurations": [
        {"trial": 1, "seeds": [0, 1, 2], "reward": 0.45, "reward_ci": [0.43, 0.47], "verdict": "feasible",
         "projected_yuan": 2.0, "priced_rounds": 2}]}
    c = compare(row, ref, "trl-defaults", section, seed=0, threshold=THR)
    assert c["priced"] and c["reference"] and c["saving_yuan"] == 3.0 and c["saving_pct_ci"] is None
    assert "the answer's at 1 yuan: the confirmation round left the references out" in c["text"]


def test_a_round_that_names_a_configuration_below_the_threshold_does_not_make_it_the_answer(tmp_path):
    below = json.loads(json.dumps(CONFIRMED)) | {"winner": 2, "named": [2], "final_verdict": "confirmed: trial 2",
                                                  "sentence": "confirmed: trial 2", "saving_ratio": None}
    study = record(tmp_path / "s.db", [
        probe(0.47, 0.45, 0.49, 2.0, micro=1, baseline=True),
        probe(0.391, 0.365, 0.417, 1.0, micro=4),
        probe(0.43, 0.41, 0.45, 0.8, micro=8),
    ], threshold=THR, confirmation=below)
    res = result_of(study, tmp_path / "out", threshold=THR)
    # trial 2's probe reached it, its seeds together do not: the answer is trial 1, as confirmed over its seeds
    assert res.best["number"] == 1 and res.reaches["reward"]["confirmed"] and res.verdict == "unconfirmed"
    assert "named trial 2, whose reward over its seeds is below the threshold" in res.answer


def test_the_report_headline_shows_the_answers_trial_reward_and_threshold(tmp_path):
    from report_synth import write_run

    runs = [write_run(tmp_path / "out" / "runs", f"r{i}", reward=0.45, yuan=2.0 - i) for i in range(3)]
    study = record(tmp_path / "s.db", [
        probe(0.47, 0.45, 0.49, 2.0, micro=1, baseline=True, run_dir=runs[0]),
        probe(0.391, 0.365, 0.417, 1.0, micro=4, run_dir=runs[1]),
        probe(0.43, 0.41, 0.45, 0.8, micro=8, run_dir=runs[2]),
    ], threshold=THR, confirmation=CONFIRMED, spent_confirming=3.0)
    result_of(study, tmp_path / "out", threshold=THR)
    html = build_report([tmp_path / "out"], tmp_path / "report.html").read_text()
    assert "Cheapest configuration that reaches the threshold: trial 1" in html
    assert "0.407 [0.401, 0.413] over seeds 0, 1, 2" in html and "reward vs threshold 0.4" in html
    assert "confirmed: trial 1: it costs 0.5x" in html and "<b>confirmed</b>: confirmed" not in html  # said once


def test_on_the_recorded_search_the_costs_quoted_agree_with_the_round_s_paired_ratio(tmp_path, monkeypatch):
    """The trials' own probes ran at other times (the baseline's seed-0 probe on a quieter machine: 25.6 s against
    about 50 s for every later probe), so their projections put trial 12 dearer than the baseline while the round,
    run side by side, puts it at under half. The answer, the terminal and the report quote the round's figures.
    The baseline's three seeds disagree (0.44 on average, their means far apart), so over the seeds it reaches the
    threshold 0.4 only within noise too: no configuration reaches it beyond noise."""
    from search_record import recorded_search, redecide

    monkeypatch.chdir(tmp_path)
    out = recorded_search(tmp_path)
    res = redecide(out)
    r = res.reaches
    assert r["trial"] == 12 and r["verdict"] == "within noise" and r["surely"] is None
    base = next(c for c in res.confirmation["configurations"] if c["trial"] == 0)
    assert base["reward_ci"][0] < 0.4 < base["reward"]  # the seeds' spread widens it across the threshold
    vs = r["against"][0]
    ratio = vs["ratio"]["ratio"]
    assert vs["trial"] == 0 and 0.46 < ratio < 0.50
    # the two projections the answer quotes stand in the ratio it quotes, and are the round's, not seed 0's
    base_yuan = r["projected_yuan"] / ratio
    assert r["cost"]["confirmed"] and r["cost"]["seeds"] == [1, 2]
    assert base_yuan != pytest.approx(res.baseline["projected_yuan"], rel=0.1)
    assert vs["saving_yuan"] == pytest.approx(base_yuan - r["projected_yuan"], rel=1e-9)
    text = printed(res)
    answer = text.split("answer:")[1]
    assert f"trial 12, projected {r['cost']['text']}" in answer
    assert f"paired cost ratio {ratio:.3f}x" in answer
    # the report's table, headline and cost-vs-reward chart: one row per configuration at the round's projection
    records = load_records([Path("search-out/tiny-ppo")])
    table = data.fold_seeds(data.probe_table(records)[0], records.searches).set_index("trial")["projected_yuan"]
    assert table[12] / table[0] == pytest.approx(ratio, rel=1e-9) and table[12] == pytest.approx(r["projected_yuan"])
    html = build_report([Path("search-out/tiny-ppo")], tmp_path / "report.html").read_text()
    assert f'<div class="v">¥{r["projected_yuan"]:.4g}</div><div class="k">projected full-run cost' in html
    # the confirmation round's table: each configuration's projection in plain words, next to its ratio
    assert f"<td>¥{r['projected_yuan']:.4g}</td><td>{ratio:.3f} [" in html and "<th>projected_wall_s</th>" not in html


def test_a_round_within_noise_that_told_the_costs_apart_quotes_one_saving_everywhere(tmp_path, monkeypatch):
    """The recorded search's round: trial 12 costs 0.478x the baseline side by side, its reward within noise of the
    threshold, so the round confirms no saving of its own. The answer reaches the threshold within noise, and the
    saving its comparison line quotes is the one search.json, the payback line and the report's headline quote."""
    from search_record import recorded_search, redecide

    monkeypatch.chdir(tmp_path)
    res = redecide(recorded_search(tmp_path))
    vs = res.reaches["against"][0]
    assert res.confirmation["saving_ratio"] is None and res.reaches["verdict"] == "within noise"
    assert vs["name"] == "the baseline" and vs["ratio"]["apart"]
    assert (res.saving_yuan, res.saving_pct) == (vs["saving_yuan"], vs["saving_pct"]) and 50 < res.saving_pct < 55
    # the saving's interval is the rounds': each round's own saving lies inside it, not only the steps' bootstrap
    low, high = vs["saving_pct_ci"]
    assert all(low <= 100 * (1 - x) <= high for x in vs["ratio"]["per_round"]) and vs["ratio"]["noise_ci"]
    assert (high - low) > 100 * (vs["ratio"]["ci"][1] - vs["ratio"]["ci"][0])
    assert "the interval from how far the rounds' ratios move" in vs["text"]
    text = printed(res)
    assert "with no saving against the baseline" not in text
    assert f"why ({res.verdict}): {' '.join(res.answer.split())}" in " ".join(text.split())
    repeats = sum(t["duplicate_of"] is not None for t in res.trials)
    assert f"{len(res.trials)} trial(s), {repeats} of them a repeat of an earlier one" in text or not repeats
    assert (f"the saving of {res.saving_yuan:.4g} yuan a run, if its reward, within noise of the threshold, holds, pays "
            f"for it after {res.reaches['payback_runs']} full run(s)") in text
    assert f"({res.saving_pct:.1f}%), if its reward, within noise of the threshold, holds" in text
    html = build_report([Path("search-out/tiny-ppo")], tmp_path / "report.html").read_text()
    assert f"({res.saving_pct:.1f}%)</span>" in html and "saving vs baseline (none" not in html


def test_the_answer_is_priced_against_the_baseline_and_each_reference_one_below_the_threshold_is_not_priced(tmp_path):
    study = record(tmp_path / "s.db", [
        probe(0.46, 0.43, 0.49, 4.0, micro=1, baseline=True),
        probe(0.20, 0.15, 0.25, 1.0, micro=8, reference="slow-learner"),   # cheapest per run, but never reaches it
        probe(0.47, 0.44, 0.50, 3.0, micro=16, reference="framework"),
        probe(0.45, 0.41, 0.49, 2.0, micro=4),
    ], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 3  # a reference is priced against, never the answer (trial 1 is cheaper but below)
    against = {a["name"]: a for a in res.reaches["against"]}
    assert list(against) == ["the baseline", "slow-learner", "framework"]
    # no confirmation round: the single probes' projections, without an interval
    assert against["the baseline"]["saving_yuan"] == pytest.approx(2.0) and against["the baseline"]["saving_pct"] == pytest.approx(50.0)
    assert against["framework"]["saving_yuan"] == pytest.approx(1.0) and against["framework"]["saving_pct_ci"] is None
    assert not against["slow-learner"]["priced"] and against["slow-learner"]["saving_yuan"] is None
    text = printed(res)
    assert "against slow-learner (trial 1): it does not reach the threshold 0.4 within its probes (reward 0.200" in text
    assert "not priced" in text and "against framework (trial 2), full run 3 yuan (single probe, seed 0): saving 1 yuan, 33.3%" in text


def test_a_baseline_within_noise_is_priced_as_the_answer_is_and_no_line_says_otherwise(tmp_path):
    # a SmolLM2 search's case: the baseline and the answer both straddle the threshold (read as reaching it), so the
    # saving the comparison quotes is the search's saving, and it pays for the search after a number of runs
    study = record(tmp_path / "s.db", [
        probe(0.399, 0.37, 0.43, 1.6, micro=1, baseline=True, spend=1.7),
        probe(0.399, 0.37, 0.43, 1.2, micro=4, spend=1.6),
    ], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 1 and res.reaches["verdict"] == "within noise"
    assert res.saving_yuan == pytest.approx(0.4) and res.saving_pct == pytest.approx(25.0)
    assert res.reaches["against"][0]["saving_yuan"] == pytest.approx(res.saving_yuan)
    text = printed(res)
    assert "no saving to report" not in text and "with no saving against the baseline" not in text
    assert "the saving of 0.4 yuan a run, if its reward, within noise of the threshold, holds, pays for it after 9 full run(s)" in text


def test_a_reference_not_yet_probed_is_said_to_be_waiting_not_to_have_ended(tmp_path):
    """A search read between its probes (a part stopped at its time limit, search.json written after each probe): the
    reference still queued has no probe, and the answer must not say one ended."""
    study = record(tmp_path / "s.db", [probe(0.46, 0.43, 0.49, 4.0, micro=1, baseline=True),
                                       probe(0.45, 0.41, 0.49, 2.0, micro=4)], threshold=THR)
    study.enqueue_trial({MICRO: 8}, user_attrs={"reference": "framework"})
    res = result_of(study, tmp_path / "out", threshold=THR, reason="time limit")
    against = {a["name"]: a for a in res.reaches["against"]}
    assert not against["framework"]["priced"] and against["the baseline"]["priced"]
    assert "against framework (trial 2): not probed yet (waiting), not priced" in printed(res)
    assert "its probe ended waiting" not in printed(res)
    # a reference the search keeps until a part has time for it (no trial yet) reads the same, without a number
    study.set_user_attr("references", [{"name": "trl-defaults", "params": {MICRO: 16}, "sets": ["runner=trl"]}])
    res = result_of(study, tmp_path / "out", threshold=THR, reason="time limit")
    assert res.references_waiting == ["trl-defaults"]
    assert "against trl-defaults: not probed yet (waiting), not priced" in printed(res)
    assert json.loads(res.json_path.read_text())["references_waiting"] == ["trl-defaults"]


def test_an_answer_priced_with_a_warm_start_says_so():
    """A probe that found its compile cache warm while no cold start of its shapes was measured (its cold probe was
    stopped before it recorded one) prices its run low: the answer's cost says so; a cold-priced one says nothing."""
    from tunekit.estimate.cold_start import warm_priced

    assert warm_priced({"cost/overhead_source": "own", "compile_cache/inductor": "hit"})
    assert warm_priced({"cost/overhead_source": "own", "compile_cache/inductor": "partial"})
    assert not warm_priced({"cost/overhead_source": "own", "compile_cache/inductor": "miss"})
    assert not warm_priced({"cost/overhead_source": "cold probe p0", "compile_cache/inductor": "hit"})
    assert not warm_priced({"cost/overhead_source": "own"})  # nothing compiled: nothing a cache could have saved


def test_the_answer_s_cost_names_a_warm_priced_probe(tmp_path):
    study = record(tmp_path / "s.db", [probe(0.46, 0.43, 0.49, 4.0, micro=1, baseline=True),
                                       probe(0.45, 0.41, 0.49, 2.0, micro=4, warm_priced=True)], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    assert res.best["number"] == 1 and res.best["warm_priced"]
    text = printed(res)
    assert "full run: trial 1, projected 2 yuan (single probe, seed 0; priced with its own warm start" in text
    assert "4 yuan (single probe, seed 0): saving" in text  # the baseline's, priced cold, says nothing more


def test_the_report_says_whose_reward_and_how_sure_the_price_as_the_terminal_does(tmp_path):
    """An answer that learns as the baseline does (the same learning keys, a curve that agreed) quotes the baseline's
    probe's reward, saying so beside its own reading; its price, from its own warm start, says it is low."""
    from report_synth import write_run

    runs = [write_run(tmp_path / "out" / "runs", f"r{i}", reward=0.45, yuan=4.0 - 2 * i) for i in range(2)]
    study = record(tmp_path / "s.db", [
        probe(0.46, 0.43, 0.49, 4.0, micro=1, baseline=True, run_dir=runs[0]),
        probe(0.46, 0.43, 0.49, 2.0, micro=4, warm_priced=True, learning_of=0, own=0.47, run_dir=runs[1])], threshold=THR)
    res = result_of(study, tmp_path / "out", threshold=THR)
    said = "reward 0.460 [0.430, 0.490] (trial 0's probe, seed 0: the same learning; its own 0.470)"
    warm = "full run: trial 1, projected 2 yuan (single probe, seed 0; priced with its own warm start"
    assert said in printed(res) and warm in printed(res)
    import html as markup

    page = " ".join(markup.unescape(build_report([tmp_path / "out"], tmp_path / "report.html").read_text()).split())
    assert said in page and warm in page


def test_an_unconfirmed_saving_says_when_its_probes_ran_on_different_machines(tmp_path):
    """Two machines of one GPU kind can step one configuration 1.5x apart: a saving read off single probes from two
    machines says so; one from a single machine, or from probes that recorded no machine, does not."""
    def notes(base: str | None, best: str | None) -> tuple[str, list[str]]:
        probes = [probe(0.46, 0.43, 0.49, 4.0, micro=1, baseline=True, machine=base),
                  probe(0.45, 0.41, 0.49, 2.0, micro=4, machine=best)]
        study = record(tmp_path / f"{base}-{best}.db", probes, threshold=THR)
        res = result_of(study, tmp_path / "out", threshold=THR)
        assert res.best["number"] == 1 and res.best["machine"] == best
        return printed(res), res.notes

    text, said = notes("m1", "m2")
    said_apart = "the saving compares two probes run at different times, on different machines, unconfirmed side by side."
    assert said_apart in said
    assert "(probes run at different times, on different machines, not side by side in a confirmation round" in text
    for base, best in (("m1", "m1"), (None, "m2"), (None, None)):
        text, said = notes(base, best)
        assert "different machines" not in text and "the saving compares two probes run at different times, " \
            "unconfirmed side by side." in said


def _drop_partners(out: Path) -> None:
    import optuna
    from search_record import CONFIRM_ATTR

    study = optuna.load_study(study_name="tiny-ppo", storage=f"sqlite:///{out / 'study.db'}")
    section = study.user_attrs[CONFIRM_ATTR]
    study.set_user_attr(CONFIRM_ATTR, section | {"probes": [p for p in section["probes"] if not p.get("partner")]})


def _on_machines(out: Path, machines: dict[tuple[int, int], str]) -> None:
    """Records each (trial, round) probe of the recorded search's confirmation round as run on the machine given."""
    section = json.loads((out / "search.json").read_text())["confirmation"]
    for p in section["probes"]:
        path = Path(p["run_dir"]) / "summary.json"
        summary = json.loads(path.read_text())
        summary["machine/id"] = machines[(p["trial"], p["round"])]
        path.write_text(json.dumps(summary))


def _partner(out: Path, trial: int, rnd: int, machine: str) -> None:
    """Adds to the recorded search's round a partner probe: ``trial``'s probe of round ``rnd`` again, on ``machine``
    (its run directory copied, the copy's summary naming ``machine``)."""
    import optuna
    from search_record import CONFIRM_ATTR

    study = optuna.load_study(study_name="tiny-ppo", storage=f"sqlite:///{out / 'study.db'}")
    section = study.user_attrs[CONFIRM_ATTR]
    (p,) = [p for p in section["probes"] if (p["trial"], p["round"]) == (trial, rnd)]
    again = dict(p, run_dir=p["run_dir"] + "-again", partner=True)
    shutil.copytree(p["run_dir"], again["run_dir"])
    summary = json.loads((Path(again["run_dir"]) / "summary.json").read_text())
    (Path(again["run_dir"]) / "summary.json").write_text(json.dumps(summary | {"machine/id": machine}))
    study.set_user_attr(CONFIRM_ATTR, section | {"probes": [*section["probes"], again]})


def test_a_confirmation_round_resumed_on_another_machine_pairs_only_the_probes_of_one(tmp_path, monkeypatch):
    """Round 1 of the recorded search's round probed trial 12 on another machine than trials 0 and 9: the paired
    ratios of trial 12 keep round 0 only, trial 9's against the baseline keep both, the section and the answer's
    notes say which round was split; with both of trial 12's rounds on the other machine it is paired with nothing
    and trial 9 is the answer; with the baseline's on a machine of their own nothing is confirmed, and a candidate's comparison with
    the baseline says why it has no interval."""
    from search_record import recorded_search, redecide

    monkeypatch.chdir(tmp_path)
    out = recorded_search(tmp_path)
    both = redecide(out).confirmation
    assert both["split_rounds"] == []
    assert [len(both["ratios_vs_baseline"][n]["cost"]["per_round"]) for n in ("9", "12")] == [2, 2]

    _on_machines(out, {(0, 0): "a", (9, 0): "a", (12, 0): "a", (0, 1): "a", (9, 1): "a", (12, 1): "b"})
    res = redecide(out)
    c = res.confirmation
    assert c["split_rounds"] == [{"round": 1, "machines": {"0": ["a"], "9": ["a"], "12": ["b"]}}]
    assert len(c["ratios_vs_baseline"]["12"]["cost"]["per_round"]) == 1
    assert len(c["ratios_vs_baseline"]["9"]["cost"]["per_round"]) == 2
    assert c["ratios_vs_baseline"]["12"]["cost"]["per_round"][0] == pytest.approx(both["ratios_vs_baseline"]["12"]["cost"]["per_round"][0])
    assert any("resumed on another machine: round(s) 1 ran on more than one" in n for n in res.notes)

    # the baseline probed again beside trial 12 on its machine (a partner probe, here a copy of its round-1 probe):
    # trial 12 pairs in both rounds again, each pair on one machine, with the ratios the undivided round gave;
    # the baseline's reward counts its seed once
    _partner(out, 0, 1, "b")
    res = redecide(out)
    c = res.confirmation
    assert c["split_rounds"] == [{"round": 1, "machines": {"0": ["a", "b"], "9": ["a"], "12": ["b"]}}]
    assert c["partners"] == [{"trial": 0, "seed": c["seeds"][1], "machine": "b"}]
    for n in ("9", "12"):
        assert c["ratios_vs_baseline"][n]["cost"]["per_round"] == pytest.approx(both["ratios_vs_baseline"][n]["cost"]["per_round"])
    base = {x["trial"]: x for x in c["configurations"]}[0]
    assert base["reward"] == pytest.approx({x["trial"]: x for x in both["configurations"]}[0]["reward"]) and base["priced_rounds"] == 3
    assert any(f"probed again on the machine of the probes they pair with: trial 0 at seed {c['seeds'][1]})" in n
               for n in res.notes)
    assert f"trial 0 (seed {c['seeds'][1]}, again on its pair's machine)" in data.names(load_records([Path("search-out/tiny-ppo")]))
    _drop_partners(out)

    _on_machines(out, {(0, 0): "a", (9, 0): "a", (12, 0): "b", (0, 1): "a", (9, 1): "a", (12, 1): "b"})
    res = redecide(out)
    c = res.confirmation
    assert c["ratios_vs_baseline"]["12"] is None and c["paired"]["0"]["12"] is None
    assert c["ratios_vs_baseline"]["9"] is not None and c["named"] == [9] and res.reaches["trial"] == 9

    # the baseline's probes on a machine of their own: no pair, no confirmed saving, and the answer says why
    _on_machines(out, {(0, 0): "b", (9, 0): "a", (12, 0): "a", (0, 1): "b", (9, 1): "a", (12, 1): "a"})
    res = redecide(out)
    assert res.confirmation["verdict"] == "unconfirmed" and res.confirmation["ratios_vs_baseline"] == {"9": None, "12": None}
    assert res.confirmation["sentence"] == "unconfirmed: no round probed the baseline on the machine of trial(s) 9, 12"
    rows = {r["number"]: r for r in res.trials}
    against = compare(rows[9], rows[0], "the baseline", res.confirmation, seed=0, threshold=THR)
    assert against["text"].endswith("(the confirmation round probed them on different machines: no interval)"), against["text"]
    assert against["priced"] and against["saving_pct_ci"] is None
