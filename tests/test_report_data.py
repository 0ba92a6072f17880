"""Report data functions on synthetic run directories: table, Pareto front, differences, headline, history, gaps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pandas as pd
import pytest
from report_synth import write_run, write_search

from tunekit import metrics
from tunekit.config import load_recipe
from tunekit.config.errors import TunekitError
from tunekit.report import checks, data, headline, series
from tunekit.report.load import load_records


def test_pareto_front_keeps_only_undominated_points_in_cost_order():
    costs = [10.0, 8.0, 12.0, 8.0, None, 20.0, 5.0]
    rewards = [0.6, 0.5, 0.7, 0.4, 0.9, 0.65, float("nan")]
    # 8/0.5 beats 8/0.4; 10/0.6 and 12/0.7 each add reward; 20/0.65 is dominated by 12/0.7; None/NaN never count
    assert data.pareto_front(costs, rewards) == [1, 0, 2]


def test_pareto_front_of_equal_points_keeps_one():
    assert data.pareto_front([1.0, 1.0], [0.5, 0.5]) == [0]


def test_varying_knobs_hides_equal_columns_and_counts_absent_as_a_value():
    df = pd.DataFrame({"knob:a": [1, 1, 1], "knob:b": [1, 2, 1], "knob:c": ["x", "x", None], "knob:d": [None, None, None]})
    assert data.varying_knobs(df, ["knob:a", "knob:b", "knob:c", "knob:d"]) == ["knob:b", "knob:c"]


@pytest.mark.parametrize("status,reward,thr,feasible,want", [
    ("oom", None, 0.5, None, "failed"), ("timeout", 0.9, 0.5, None, "failed"), ("running", 0.9, 0.5, None, "incomplete"),
    ("ok", 0.5, 0.5, None, "feasible"), ("ok", 0.49, 0.5, None, "infeasible"), ("ok", None, 0.5, None, "infeasible"),
    ("ok", 0.9, None, None, "ok"), ("ok", 0.1, 0.5, True, "feasible"), ("pruned", 0.9, 0.5, None, "pruned"),
])
def test_classify(status, reward, thr, feasible, want):
    assert data.classify(status, reward, thr, feasible) == want


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "search" / "runs"
    return [
        write_run(root, "20250101-000000-base", reward=0.75, yuan=20.0),
        write_run(root, "20250101-000100-mb4", reward=0.62, yuan=12.0, overrides=("system.batch.micro_batch_size=4",), seed=1),
        write_run(root, "20250101-000200-oom", status="oom", reason="CUDA out of memory", overrides=("system.batch.micro_batch_size=32",)),
        write_run(root, "20250101-000300-cheap", reward=0.3, yuan=5.0, overrides=("system.memory.param_offload=true",), seed=3,
                  extra={"rollout/staleness_steps": 2}),
    ]


def test_probe_table_orders_feasible_by_cost_then_infeasible_then_failed(runs):
    df, knobs = data.probe_table(load_records([runs[0].parent]))
    assert df["label"].tolist() == ["run 2", "run 1", "run 4", "run 3"]
    assert df["category"].tolist() == ["feasible", "feasible", "infeasible", "failed"]
    assert df.loc[df.label == "run 3", "reason"].item() == "CUDA out of memory"
    assert math.isnan(df.loc[df.label == "run 3", "projected_yuan"].item())
    varying = data.varying_knobs(df, knobs)
    assert set(varying) == {"knob:system.batch.micro_batch_size", "knob:system.memory.param_offload"}
    assert "knob:algorithm.name" in knobs and "knob:algorithm.name" not in varying


def test_probe_reward_reads_the_recipes_window(tmp_path):
    run = write_run(tmp_path, "r", reward=0.8, overrides=("search.reward_window=1",))
    probe = load_records([run]).probes[0]
    assert data.probe_reward(probe) == pytest.approx(probe.steps["reward/mean"].iloc[-1])


def test_a_search_reading_the_held_out_reward_is_reported_by_it(tmp_path):
    """With search.reward_metric eval/reward_mean the report's reward, its curve and its words are the held-out
    evaluations', not the training batch's beside the held-out interval."""
    import pandas as pd

    from tunekit.report import build_report, series

    held = ("search.reward_metric=eval/reward_mean", "probe.eval_every=5", "task.eval_fraction=0.1", "search.reward_window=10")
    run = write_run(tmp_path, "r", reward=0.3, steps=20, overrides=held, extra={"eval/reward_before": 0.125})
    steps = pd.read_parquet(run / "steps.parquet")
    steps["eval/reward_mean"] = [0.9 if i % 5 == 4 else None for i in range(len(steps))]
    steps.to_parquet(run / "steps.parquet")
    from tunekit.rundir import EvalSampleLog

    answers = EvalSampleLog(run)  # what the model answered before training and after 20 steps
    answers.add(0, ["2+2=", "<b>3+3=</b>"], ["5", "6"], ["4", "6"], [0.0, 1.0])
    answers.add(20, ["2+2=", "<b>3+3=</b>"], ["4", "6"], ["4", "6"], [1.0, 1.0])
    probe = load_records([run]).probes[0]
    assert data.probe_reward(probe) == pytest.approx(0.9) and steps["reward/mean"].tail(10).mean() < 0.5
    # each evaluation at the steps trained when it ran (after the fifth step: 5), the one before training at 0
    curve = series.reward_curve(probe)
    assert curve["step"].tolist() == [0, 5, 10, 15, 20] and curve["smooth"].tolist() == pytest.approx([0.125] + [0.9] * 4)
    df, _ = data.probe_table(load_records([run]))
    assert df["metric"].tolist() == ["eval/reward_mean"] and df["reward"].tolist() == pytest.approx([0.9])
    html = build_report([run], tmp_path / "report.html").read_text()
    assert "reward = held-out reward: greedy answers to the held-out prompts" in html
    assert "mean of the last 10 steps" not in html
    assert "mean reward after 0 steps 0.5 over 2; after 20 steps 1 over 2" in html
    assert "&lt;b&gt;3+3=&lt;/b&gt;" in html and "<b>3+3=" not in html  # the prompts as text, escaped


def test_cost_reward_points_front_and_threshold(runs):
    df, _ = data.probe_table(load_records([runs[0].parent]))
    cr = data.cost_reward(df)
    assert cr["threshold"] == 0.5  # the recipe default
    assert cr["unplotted"] == ["run 3"]
    assert cr["front"] == ["run 4", "run 2", "run 1"]  # each cheaper step up buys more reward; the OOM is never on it


def test_headline_without_search_uses_cheapest_feasible_and_first_probe_as_baseline(runs):
    records = load_records([runs[0].parent])
    df, knobs = data.probe_table(records)
    h = headline.headline(records, df, knobs)
    assert h["best"]["label"] == "run 2" and h["baseline"]["label"] == "run 1"
    assert h["saving_yuan"] == pytest.approx(8.0) and h["saving_pct"] == pytest.approx(40.0)
    assert h["changes"] == [("system.batch.micro_batch_size", load_recipe(None).system.batch.micro_batch_size, 4)]
    assert h["command"].endswith(f"{runs[1].resolve()}/config.yaml --steps 1000")
    assert h["counts"] == {"feasible": 2, "below threshold": 1, "failed (oom)": 1}


@pytest.mark.parametrize("legacy", [False, True])
def test_headline_prefers_search_json(runs, legacy):
    write_search(runs[0].parent.parent, runs, best=0, baseline=1, saving_yuan=-8.0, saving_pct=-66.0, legacy=legacy)
    records = load_records([runs[0].parent.parent])
    df, knobs = data.probe_table(records)
    h = headline.headline(records, df, knobs)
    assert (h["best"]["label"], h["baseline"]["label"], h["saving_yuan"], h["command"]) == ("trial 0", "trial 1", -8.0, "tunekit probe --recipe best.yaml")
    assert h["source"] == "search.json"


def test_headline_when_nothing_is_feasible(tmp_path):
    write_run(tmp_path, "a", reward=0.3)
    write_run(tmp_path, "b", reward=0.4, seed=1)
    records = load_records([tmp_path])
    df, knobs = data.probe_table(records)
    h = headline.headline(records, df, knobs)
    assert h["best"] is None and h["top_reward"]["label"] == "run 2"


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_the_headline_never_ranks_an_infinite_reward(tmp_path, bad):
    write_run(tmp_path, "a", reward=0.75, yuan=20.0)
    broken = write_run(tmp_path, "b", reward=0.8, yuan=5.0, seed=1)
    steps = pd.read_parquet(broken / "steps.parquet")
    steps.loc[steps.index[-3:], "reward/mean"] = bad
    steps.to_parquet(broken / "steps.parquet", index=False)
    records = load_records([tmp_path])
    df, knobs = data.probe_table(records)
    assert df.loc[df.label == "run 2", "category"].item() == "infeasible"
    h = headline.headline(records, df, knobs)
    assert h["best"]["label"] == "run 1"
    alone = tmp_path / "alone"
    write_run(alone, "c", reward=0.3)
    steps = pd.read_parquet(alone / "c" / "steps.parquet")
    steps.loc[steps.index[-1], "reward/mean"] = bad
    steps.to_parquet(alone / "c" / "steps.parquet", index=False)
    write_run(alone, "d", reward=0.2, seed=1)
    records = load_records([alone])
    df, knobs = data.probe_table(records)
    h = headline.headline(records, df, knobs)
    assert h["best"] is None and h["top_reward"]["label"] == "run 2"


@pytest.mark.parametrize("legacy", [False, True])
def test_search_history_from_search_json_maps_runs_to_labels(runs, legacy):
    write_search(runs[0].parent.parent, runs, best=1, baseline=0, legacy=legacy)
    records = load_records([runs[0].parent.parent])
    df, _ = data.probe_table(records)
    hist = headline.search_history(records, df)
    t = hist["trials"]
    assert hist["source"] == "search.json"
    assert t["label"].tolist() == ["trial 0", "trial 1", "trial 2", "trial 3"]
    assert t["best_so_far"].tolist() == [20.0, 12.0, 12.0, 12.0]  # P03 is cheaper but infeasible


def test_history_and_importance_from_an_optuna_study(runs, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="s1")
    dist = {"mb": optuna.distributions.CategoricalDistribution([4, 8, 32]),
            "offload": optuna.distributions.CategoricalDistribution([False, True])}
    for i, (mb, off, value, ok) in enumerate([(8, False, 20.0, True), (4, False, 12.0, True), (4, True, 5.0, False), (8, True, 9.0, False)]):
        study.add_trial(optuna.trial.create_trial(params={"mb": mb, "offload": off}, distributions=dist, value=value,
                                                  constraints={"reward": -0.1 if ok else 0.2}, user_attrs={"run_dir": str(runs[i])}))
    records = load_records([runs[0].parent], storage=storage)  # the only study is picked
    assert records.study.name == "s1"
    df, _ = data.probe_table(records)
    hist = headline.search_history(records, df)
    assert hist["source"] == "Optuna study s1"
    assert hist["trials"]["feasible"].tolist() == [True, True, False, False]
    assert hist["trials"]["best_so_far"].isna().all()  # the answer so far is the search's to say, in search.json
    # with no search.json (a search still running) the study's trials name their probes
    assert data.names(records) == ["trial 0", "trial 1", "trial 2", "trial 3"]
    imp = headline.importance(records)
    assert set(imp["values"]) == {"mb", "offload"} and sum(imp["values"].values()) == pytest.approx(1.0)


def test_importance_says_why_not(tmp_path, runs):
    storage = f"sqlite:///{tmp_path / 'one.db'}"
    optuna.create_study(storage=storage, study_name="one").add_trial(optuna.trial.create_trial(value=1.0))
    records = load_records([runs[0].parent], storage=storage, study="one")
    assert records.study.importance is None and "1 complete trial" in headline.importance(records)["note"]
    assert "no Optuna study" in headline.importance(load_records([runs[0].parent]))["note"]


def test_study_errors_are_one_sentence(tmp_path, runs):
    with pytest.raises(TunekitError, match="no such SQLite file"):
        load_records([runs[0].parent], storage=f"sqlite:///{tmp_path / 'nope.db'}")
    storage = f"sqlite:///{tmp_path / 'two.db'}"
    optuna.create_study(storage=storage, study_name="a")
    optuna.create_study(storage=storage, study_name="b")
    with pytest.raises(TunekitError, match=r"holds 2 studies \(a, b\); name one with --study"):
        load_records([], storage=storage)
    with pytest.raises(TunekitError, match="'c' is not in"):
        load_records([], storage=storage, study="c")
    with pytest.raises(TunekitError, match="needs --storage"):
        load_records([runs[0].parent], study="a")


def test_policy_verdicts_mark_stale_and_diverging_rollouts(tmp_path):
    write_run(tmp_path, "a")
    write_run(tmp_path, "b", extra={"rollout/staleness_steps": 1})
    broken = write_run(tmp_path, "c")
    steps = pd.read_parquet(broken / "steps.parquet").assign(**{"rollout/logprob_abs_diff_mean": 0.4})
    steps.to_parquet(broken / "steps.parquet")
    write_run(tmp_path, "d", drop_steps=("rollout/logprob_abs_diff_mean",))
    (tmp_path / "search.json").write_text(json.dumps({"equivalence": ["run 2 and run 1 differ in reward", {"pair": "run 1/run 3"}]}))
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    v = checks.policy_verdicts(records, df)
    assert v["probes"]["verdict"].tolist() == ["on-policy", "off-policy", "off-policy", "not measured"]
    assert "1 step(s) stale" in v["probes"]["why"][1] and "0.4 > 0.05" in v["probes"]["why"][2]
    assert v["warnings"] == ["run 2 and run 1 differ in reward", "pair: run 1/run 3"]


def test_missing_columns_and_files_are_listed_not_fatal(tmp_path):
    write_run(tmp_path, "a-new")
    write_run(tmp_path, "b-old", drop_summary=("steady", "cost/projected_yuan"), drop_steps=("timing_s/step",), nvml_samples=0)
    (tmp_path / "b-old" / "config.yaml").unlink()
    nosteps = write_run(tmp_path, "c-nosteps", seed=2)
    (nosteps / "steps.parquet").unlink()
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    notes = checks.missing_notes(records, df)
    assert "no config.yaml: run 2" in notes
    assert "summary.json has no steady: run 2" in notes and "summary.json has no cost/projected_yuan: run 2" in notes
    assert "steps.parquet has no column timing_s/step: run 2" in notes
    assert "no steps.parquet: run 3" in notes
    assert not any("nvml" in n for n in notes)  # NVML absent on a probe that had none is not news
    # the old probe still gets step times from steps.parquet (steady fallback), minus the missing step column
    times = series.phase_times({"run 2": records.probes[1]})
    assert times.loc["run 2", "gen"] > 0


def test_no_runs_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TunekitError, match="has no probe runs"):
        load_records([tmp_path / "empty"])
    with pytest.raises(TunekitError, match="does not exist"):
        load_records([tmp_path / "absent"])


def test_series_memory_per_gpu_with_roles(tmp_path):
    run = write_run(tmp_path, "two", gpus=2, overrides=("system.device_map={actor: [0], critic: [0], ref: [1], rollout: [1], reward: [1]}",))
    probe = load_records([run]).probes[0]
    mem = series.memory({"run 1": probe})
    assert mem["series"].tolist() == ["allocator allocated", "allocator reserved", "NVML GPU 0", "NVML GPU 1"]
    assert mem.set_index("series").loc["NVML GPU 1", "roles"] == "ref, rollout, reward"
    comm = series.comm_phases({"run 1": probe})
    assert set(comm["phase"]) == {"gen", "update_actor"} and (comm["exposed_s"] <= comm["total_s"]).all()


def test_downsample_keeps_peaks_and_bounds_points():
    df = pd.DataFrame({"step": range(1000), "t": [1.0] * 1000, "mem": [1.0] * 999 + [9.0]})
    out = series.downsample(df, 100, x="step", peaks=("mem",))
    assert len(out) == 100 and out["step"].iloc[-1] == 990 and out["mem"].max() == 9.0 and out["t"].max() == 1.0
    assert len(series.downsample(df.head(50), 100, x="step")) == 50


def test_drilldown_series_are_bounded(tmp_path):
    probe = load_records([write_run(tmp_path, "long", steps=1000, nvml_samples=2000, gpus=2)]).probes[0]
    dd = series.drilldown(probe)
    assert len(dd["timing"]) <= series.MAX_POINTS and len(dd["memory"]) <= series.MAX_POINTS
    assert dd["nvml"].groupby("gpu").size().max() <= series.MAX_POINTS and dd["nvml"]["t"].min() == 0


def test_search_json_without_a_saving_is_respected(runs):
    # baseline P03 is infeasible: the search reports no saving, and says why in its notes
    write_search(runs[0].parent.parent, runs, best=1, baseline=3, notes=["the baseline did not reach the threshold"])
    records = load_records([runs[0].parent.parent])
    df, knobs = data.probe_table(records)
    h = headline.headline(records, df, knobs)
    assert h["best"]["label"] == "trial 1" and h["saving_yuan"] is None and h["notes"] == ["the baseline did not reach the threshold"]


def test_learning_mismatch_marks_both_probes_in_red(runs):
    sentence = "trials 0 and 1 differ only in system.batch.micro_batch_size but their reward differs"
    write_search(runs[0].parent.parent, runs, best=1, baseline=0, learning={
        "pairs_compared": 1, "method": "z-test", "mismatches": [{"trial_a": 0, "trial_b": 1, "sentence": sentence}]})
    records = load_records([runs[0].parent.parent])
    df, _ = data.probe_table(records)
    v = checks.policy_verdicts(records, df)
    rows = v["probes"].set_index("label")
    assert rows.loc["trial 0", "verdict"] == rows.loc["trial 1", "verdict"] == "off-policy"
    assert rows.loc["trial 0", "why"] == "learns differently from trial 1"
    assert rows.loc["trial 3", "verdict"] == "off-policy" and rows.loc["trial 2", "verdict"] == "on-policy"
    assert v["warnings"] == [sentence] and v["checks"][0].startswith("1 pair(s)")


def test_cpu_probes_are_not_missing_gpu_memory(tmp_path):
    write_run(tmp_path, "cpu", nvml_samples=0, drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    write_run(tmp_path, "gpu", drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    assert checks.missing_notes(records, df) == ["summary.json steady has no perf/max_memory_reserved_gb: run 2"]


def _table(root: Path):
    records = load_records([root])
    df, knobs = data.probe_table(records)
    return records, df, knobs


def test_trials_are_named_by_their_optuna_number_and_other_runs_by_start_order(tmp_path):
    runs = [write_run(tmp_path / "runs", f"2025010{i}-r", reward=0.6, yuan=10.0 + i, seed=i) for i in range(3)]
    path = write_search(tmp_path, runs[:2], best=0, baseline=1)
    found = json.loads(path.read_text())
    for t, n in zip(found["trials"], (5, 9)):  # Optuna numbers need not be the trial's position
        t["number"] = n
    path.write_text(json.dumps(found))
    _, df, _ = _table(tmp_path)
    assert dict(zip(df["id"], df["label"])) == {"20250100-r": "trial 5", "20250101-r": "trial 9", "20250102-r": "run 3"}


def test_two_searches_prefix_their_study(tmp_path):
    for study in ("a", "b"):
        run = write_run(tmp_path / study / "runs", f"r-{study}")
        write_search(tmp_path / study, [run], best=0, baseline=0, study=study)
    _, df, _ = _table(tmp_path)
    assert sorted(df["label"]) == ["a trial 0", "b trial 0"]


def test_table_columns_keep_only_metrics_with_a_value(tmp_path):
    write_run(tmp_path, "a", nvml_samples=0, drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    write_run(tmp_path, "b", nvml_samples=0, seed=1, drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    _, df, _ = _table(tmp_path)
    cols = data.table_columns(df)
    assert cols[:2] == ["reward", "projected_yuan"] and "step_s" in cols
    for empty in ("reward_ci", "threshold", "projected_steps", "peak_reserved_gb", "nvml_peak_gb", "mfu_actor", "reason"):
        assert empty not in cols  # no value anywhere, or (threshold) the same for every probe
    write_run(tmp_path, "c", overrides=("search.reward_threshold=0.3",), seed=2, nvml_samples=0, status="oom", reason="out of memory")
    cols = data.table_columns(_table(tmp_path)[1])
    assert "threshold" in cols and cols[-1] == "reason" and "nvml_peak_gb" not in cols


def test_the_searchs_interval_verdict_and_projected_steps_are_read_when_present(runs):
    path = write_search(runs[0].parent.parent, runs, best=1, baseline=0)
    found = json.loads(path.read_text())
    found["trials"][0] |= {"verdict": "within_noise", "reward_ci": [0.41, 0.58], "projected_steps": 640}
    found["trials"][1] |= {"reward_ci": {"low": 0.55, "high": 0.7}}
    path.write_text(json.dumps(found))
    _, df, _ = _table(runs[0].parent.parent)
    row = df.set_index("label")
    assert row.loc["trial 0", "category"] == "within noise" and row.loc["trial 0", "outcome"] == "within noise"
    assert (row.loc["trial 0", "reward_low"], row.loc["trial 0", "reward_high"], row.loc["trial 0", "projected_steps"]) == (0.41, 0.58, 640)
    assert (row.loc["trial 1", "reward_low"], row.loc["trial 1", "reward_high"]) == (0.55, 0.7)
    assert "reward_ci" in data.table_columns(df) and "projected_steps" in data.table_columns(df)
    assert math.isnan(row.loc["trial 3", "reward_low"])


def test_a_finished_probe_below_the_threshold_is_never_called_ok(runs):
    _, df, _ = _table(runs[0].parent)
    low = df[df["id"] == runs[3].name].iloc[0]
    assert (low["status"], low["category"], low["outcome"]) == ("ok", "infeasible", "below threshold")
    groups = series.drill_groups(load_records([runs[3]]).probes[0], low["outcome"])
    assert groups["run"][0] == ("outcome", "below threshold", "") and not any(k == "status" for k, _, _ in groups["run"])


def test_pruned_trials_are_drawn_at_their_own_projection_not_the_cheap_end(tmp_path):
    runs = [write_run(tmp_path / "runs", "t0", reward=0.7, yuan=10.0),
            write_run(tmp_path / "runs", "t1", status="pruned", reason="pruned on cost", seed=1, extra={"cost/projected_yuan": 55.0}),
            write_run(tmp_path / "runs", "t2", status="oom", reason="CUDA out of memory", seed=2)]
    write_search(tmp_path, runs, best=0, baseline=0)
    records, df, _ = _table(tmp_path)
    hist = headline.search_history(records, df)["trials"].set_index("number")
    assert hist.loc[1, "value"] == 55.0 and hist.loc[1, "category"] == "pruned" and "after 10 steps" in hist.loc[1, "value_from"]
    assert hist.loc[0, "value_from"] == "objective" and hist.loc[0, "value"] == 10.0
    assert hist.loc[2, "value"] is None or math.isnan(hist.loc[2, "value"])  # no projection at all: listed, not drawn
    assert hist["best_so_far"].tolist() == [10.0, 10.0, 10.0]


def test_mixed_recipes_are_a_comparison_without_baseline_or_saving(tmp_path):
    write_run(tmp_path, "1-a", reward=0.7, yuan=10.0, overrides=("name=alpha",))
    write_run(tmp_path, "2-b", reward=0.7, yuan=5.0, overrides=("name=beta",), seed=1)
    records, df, knobs = _table(tmp_path)
    h = headline.headline(records, df, knobs)
    assert h["kind"] == {"search": False, "recipes": ["alpha", "beta"], "runs": 2}
    assert h["best"]["label"] == "run 2" and h["baseline"] is None and h["saving_yuan"] is None and h["changes"] == []
    assert len(headline.search_history(records, df)["trials"]) == 0


def test_a_search_with_a_probe_it_has_not_recorded_yet_is_still_a_search(runs):
    write_search(runs[0].parent.parent, runs[:3], best=0, baseline=0, recipe=load_recipe(None).name, stop_reason="running")
    records, df, knobs = _table(runs[0].parent.parent)
    h = headline.headline(records, df, knobs)
    assert h["kind"]["search"] and "not finished" in h["stop"] and "stopped: running" not in h["stop"]
    assert headline.stop_sentence("reached 8 trials") == "The search stopped: reached 8 trials."


def test_comm_absence_says_why_in_one_sentence(tmp_path):
    two = ("system.device_map={actor: [0, 1], critic: [0, 1], ref: [0, 1], rollout: [0, 1], reward: [0, 1]}",)
    write_run(tmp_path / "one", "a", drop_steps=("comm/total_s/update_actor", "comm/exposed_s/update_actor", "comm/wait_s/update_actor",
                                                 "comm/total_s/gen", "comm/exposed_s/gen", "comm/wait_s/gen"))
    records, df, _ = _table(tmp_path / "one")
    probes = dict(zip(data.names(records), records.probes))
    assert "single rank" in series.comm_absence(probes, df)
    write_run(tmp_path / "two", "b", status="pruned", steps=60, overrides=two, seed=1)
    records, df, _ = _table(tmp_path / "two")
    probes = dict(zip(data.names(records), records.probes))
    why = series.comm_absence(probes, df)
    assert "run 1" in why and "pruned on cost" in why and "by step 6" in why and "last 3 of 100 steps" in why


def test_reward_curve_smooths_over_the_threshold_window(tmp_path):
    run = write_run(tmp_path, "r", steps=6)
    steps = pd.read_parquet(run / "steps.parquet").assign(**{"reward/mean": [0.0, 0.3, 0.6, 0.3, 0.0, 0.9]})
    steps.to_parquet(run / "steps.parquet")
    curve = series.reward_curve(load_records([run]).probes[0], window=3)
    assert curve["smooth"].round(6).tolist() == [0.0, 0.15, 0.3, 0.4, 0.3, 0.4]


def test_device_maps_are_one_short_knob(tmp_path):
    assert data.placement({"actor": [0, 1], "critic": [0, 1]}) == "all roles on 0,1"
    assert data.placement({"actor": [0], "critic": [0], "rollout": [1]}) == "actor,critic on 0 · rollout on 1"
    _, _, knobs = _table(write_run(tmp_path, "r").parent)
    assert "knob:system.device_map" in knobs and not any(k.startswith("knob:system.device_map.") for k in knobs)


def test_drill_groups_carry_units(tmp_path):
    probe = load_records([write_run(tmp_path, "r", extra={"perf/mfu/actor": 0.25, "cost/projected_wall_s": 7200.0,
                                                          "startup/start_key": "04e503b0ba00dd7e"})]).probes[0]
    rows = {k: (v, u) for g in series.drill_groups(probe).values() for k, v, u in g}
    assert rows["perf/mfu/actor"] == (25.0, "%") and rows["cost/projected_wall_s"] == (7200.0, "s")  # as its key says
    assert rows["startup/start_key"] == ("04e503b0ba00dd7e", "")  # a digest, not seconds
    assert rows["timing_s/gen"][1] == "s (median)" and rows["perf/max_memory_reserved_gb"][1] == "GB (peak)"
    groups = series.drill_groups(probe)
    assert {"cost", "timings", "memory", "communication"} <= set(groups)
    # a probe on CPU ranks: its hours and throughput are theirs, not a GPU's
    cpu = load_records([write_run(tmp_path / "cpu", "r", nvml_samples=0, extra={"gpus_held": 0, metrics.THROUGHPUT: 50.0,
                                                                      "cost/projected_gpu_hours": 0.5})]).probes[0]
    on_cpu = {k: u for g in series.drill_groups(cpu).values() for k, _, u in g}
    assert on_cpu["cost/projected_gpu_hours"] == "CPU-h" and on_cpu[metrics.THROUGHPUT] == "tokens/s/rank"
    assert rows["cost/probe_gpu_hours"][1] == "GPU-h"
    assert [k for k, _, _ in groups["timings"] if k.startswith("timing_s/")][-1] == "timing_s/step"


def test_confirmation_round_rows_names_and_absence(runs, tmp_path):
    again = write_run(runs[0].parent, "20250101-000400-again", reward=0.61, yuan=11.0, seed=7)
    write_search(runs[0].parent.parent, runs, best=1, baseline=0, confirmation={
        "candidates": [1], "baseline": 0, "spent_yuan": 1.5, "cut_short": None, "winner": 1, "verdict": "confirmed",
        "sentence": "trial 1 confirmed: it costs 0.61 [0.50, 0.70] of the baseline's",
        "probes": [{"trial": 1, "round": 0, "seed": 1, "status": "ok", "run_dir": str(again), "probe_yuan": 1.5}],
        "configurations": [{"trial": 0, "baseline": True, "verdict": "feasible", "reward_ci": [0.7, 0.8], "seeds": [0, 1]},
                           {"trial": 1, "baseline": False, "verdict": "feasible", "reward_ci": [0.55, 0.66], "seeds": [0, 1]}],
        "ratios_vs_baseline": {"1": {"cost": {"ratio": 0.61, "ci": [0.5, 0.7]}}}})
    records, df, _ = _table(runs[0].parent.parent)
    row = df[df["id"] == again.name].iloc[0]
    assert (row["label"], row["trial"], row["confirmation"]) == ("trial 1 (seed 1)", 1, True)
    conf = headline.confirmation(records)
    assert conf["verdict"] == "confirmed" and conf["sentence"].startswith("trial 1 confirmed") and not conf["running"]
    rows = conf["rows"].set_index("configuration")  # one row per configuration, its seeds folded in
    assert rows.loc["trial 1", "cost vs baseline"] == "0.610 [0.500, 0.700]" and rows.loc["trial 1", "reward over its seeds"] == "[0.550, 0.660]"
    assert math.isnan(rows.loc["trial 0 (baseline)", "cost vs baseline"]) and rows.loc["trial 0 (baseline)", "seeds"] == "0, 1"
    assert conf["facts"] == {"spent": "its probes cost ¥1.5"}
    assert headline.confirmation(load_records([runs[0].parent])) is None


def test_points_on_the_same_spot_share_one_label():
    pts = pd.DataFrame({"label": ["trial 1", "trial 7", "trial 2", "trial 0"], "projected_yuan": [0.04997, 0.04986, 0.02169, 0.05336],
                        "reward": [0.276, 0.276, 0.441, 0.4865]})
    # 0.04997 and 0.04986 are 0.3% of the 0.0317 wide cost axis apart: one spot; trial 0 is 10% away
    assert data.point_labels(pts) == {"trial 1": "trial 1 · trial 7", "trial 2": "trial 2", "trial 0": "trial 0"}
    many = pd.DataFrame({"label": [f"t{i}" for i in range(31)], "projected_yuan": range(31), "reward": [0.5] * 31})
    assert data.point_labels(many) == {}


def test_projection_is_the_searchs_the_pruning_bound_or_the_probes_own(tmp_path):
    summary = {"cost/projected_yuan": 50.0, "cost/projected_gpu_hours": 2.0, "cost/projected_wall_s": 7200.0}
    assert data.projection(summary, {}, "ok", None) == {"projected_yuan": 50.0, "projected_gpu_hours": 2.0, "projected_wall_s": 7200.0}
    # a search that sizes each run by its work: its cost, and none of the probe's fixed-length figures
    by_work = data.projection(summary, {"projected_yuan": 4.0, "projected_steps": 19}, "ok", None)
    assert by_work == {"projected_yuan": 4.0, "projected_gpu_hours": None, "projected_wall_s": None}
    same_length = data.projection(summary | {"cost/target_steps": 19}, {"projected_yuan": 4.0, "projected_steps": 19}, "ok", None)
    assert same_length == {"projected_yuan": 4.0, "projected_gpu_hours": 2.0, "projected_wall_s": 7200.0}
    assert data.projection(summary, {"projected_yuan": None, "projected_steps": None}, "ok", None)["projected_yuan"] is None
    assert data.projection(summary, {"projected_yuan": None}, "pruned", (0.18, 6))["projected_yuan"] == 0.18
    assert data.projection(summary, {}, "pruned", None)["projected_yuan"] == 50.0


def test_a_pruned_trial_is_drawn_at_the_bound_the_search_pruned_it_at(tmp_path):
    runs = [write_run(tmp_path / "runs", "t0", reward=0.7, yuan=10.0),
            write_run(tmp_path / "runs", "t1", status="pruned", reason="pruned on cost", seed=1, extra={"cost/projected_yuan": 55.0})]
    write_search(tmp_path, runs, best=0, baseline=0)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="s")
    study.add_trial(optuna.trial.create_trial(value=10.0, user_attrs={"run_dir": str(runs[0])}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, intermediate_values={3: 31.0, 6: 42.0},
                                              user_attrs={"run_dir": str(runs[1]), "status": "pruned"}))
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    assert df.set_index("id").loc["t1", "projected_yuan"] == 42.0  # not the probe's own 55
    hist = headline.search_history(records, df)["trials"].set_index("number")
    assert hist.loc[1, "value"] == 42.0 and hist.loc[1, "value_from"] == "the search's projection when it pruned it, after 6 steps"


def test_a_probe_whose_run_rule_says_why_it_has_no_projection_is_not_missing_it(tmp_path):
    write_run(tmp_path, "a", drop_summary=("cost/projected_yuan", "cost/projected_gpu_hours", "cost/projected_wall_s"),
              extra={"cost/run_rule": "the 10-step mean reward never reached 0.4 in the probe's 40 steps: infeasible"})
    write_run(tmp_path, "b", drop_summary=("cost/projected_yuan",), seed=1)
    records, df, _ = _table(tmp_path)
    assert checks.missing_notes(records, df) == ["summary.json has no cost/projected_yuan: run 2"]


def test_a_probe_the_search_stopped_and_retried_reads_not_finished_and_names_its_retry(tmp_path):
    """A search part that ends mid-probe marks the probe abandoned and probes its trial again: no failure of the
    configuration. The spend is the search's own count, which includes the stopped probe."""
    import json

    from tunekit.search.storage import mark_abandoned

    root = tmp_path / "s"
    runs = [write_run(root / "runs", f"P0{i}", reward=0.6, yuan=10.0 + i) for i in range(2)]
    stopped = write_run(root / "runs", "P02", status="running", reason="")
    mark_abandoned(str(stopped), "the search was stopped during trial 2; the trial was retried")
    retry = write_run(root / "runs", "P03", reward=0.6, yuan=9.0)
    path = write_search(root, [*runs, stopped, retry], best=3, baseline=0, spent_yuan=12.5)
    doc = json.loads(path.read_text())
    doc["trials"][3]["retry_of"] = 2
    path.write_text(json.dumps(doc))
    records = load_records([root])
    df, _ = data.probe_table(records)
    row = df[df["id"] == "P02"].iloc[0]
    assert row["category"] == "incomplete" and row["outcome"] == "not finished" and "abandoned" in row["reason"]
    hist = headline.search_history(records, df)["trials"]
    assert hist.loc[hist["number"] == 2, "state"].item() == "stopped, retried as trial 3"
    from tunekit.report import build_report

    page = " ".join(build_report([root], tmp_path / "r.html").read_text().split())
    assert "probe spend ¥12.5 (the search's own count, its stopped probes included)" in page
    assert "trial 2 (stopped, retried as trial 3)" in page


def test_a_trial_the_search_gave_no_price_has_none_in_the_table(tmp_path):
    """A probe killed at its timeout after its steps still projects its own run, but its search priced it at
    nothing (the objective is infinite): the table does not show the probe's own figure as its price."""
    import json

    root = tmp_path / "s"
    runs = [write_run(root / "runs", f"P0{i}", reward=0.6, yuan=10.0 + i) for i in range(2)]
    summary = json.loads((runs[1] / "summary.json").read_text())
    (runs[1] / "summary.json").write_text(json.dumps(summary | {"status": "timeout", "reason": "killed at its limit"}))
    write_search(root, runs, best=0, baseline=0)
    df, _ = data.probe_table(load_records([root]))
    row = df[df["id"] == "P01"].iloc[0]
    assert summary["cost/projected_yuan"] > 0 and pd.isna(row["projected_yuan"]) and row["status"] == "timeout"
    alone, _ = data.probe_table(load_records([runs[1]]))  # no search: the probe's own projection stands
    assert alone["projected_yuan"].iloc[0] == pytest.approx(summary["cost/projected_yuan"])


def test_a_probe_stopped_before_its_result_shows_the_start_up_its_first_step_recorded(tmp_path):
    import json

    run = write_run(tmp_path, "r", status="running", drop_summary=("startup_s",))
    (run / "startup.json").write_text(json.dumps({"startup_s": 83.0, "startup/engine_start_s": 40.5,
                                                  "compile_cache/inductor": "miss"}))
    probe = load_records([run]).probes[0]
    assert probe.summary["startup_s"] == 83.0 and probe.summary["compile_cache/inductor"] == "miss"
    assert probe.summary["status"] == "running"  # the summary's own keys stand


def test_projected_hours_are_gpu_hours_where_a_probe_held_a_gpu(tmp_path):
    def hours(name: str, **kw) -> str:
        table, _ = data.probe_table(load_records([write_run(tmp_path / name, "r", **kw)]))
        return data.device_hours(table)

    # one that held a GPU without NVML samples (system.device auto): its summary says so
    assert hours("held", nvml_samples=0) == "GPU-hours"
    assert hours("cpu", nvml_samples=0, extra={"gpus_held": 0}) == "CPU-hours"  # as a CPU probe's summary says
    # a GPU probe whose summary says neither, NVML sampled it; or its recipe asked for CUDA
    assert hours("sampled", extra={"gpus_held": 0}) == "GPU-hours"
    assert hours("asked", nvml_samples=0, extra={"gpus_held": 0}, overrides=("system.device=cuda",)) == "GPU-hours"


def test_a_probe_priced_over_another_run_length_says_so_in_its_drill_down(tmp_path):
    import json

    from tunekit.report import build_report

    root = tmp_path / "s"
    runs = [write_run(root / "runs", f"P0{i}", reward=0.6, yuan=10.0 + i) for i in range(2)]
    path = write_search(root, runs, best=1, baseline=0)
    doc = json.loads(path.read_text())
    doc["trials"][1] |= {"projected_steps": 42, "run_rule": "trial 0's, same learning: reached 0.5 at step 42"}
    path.write_text(json.dumps(doc))
    import html as markup

    page = " ".join(markup.unescape(build_report([root], tmp_path / "r.html").read_text()).split())
    assert ("The search priced this run over 42 steps (trial 0's, same learning: reached 0.5 at step 42); the "
            "probe's own records below project 1000.") in page
    assert page.count("The search priced this run over") == 1  # the baseline's own length is the search's


def test_damaged_run_records_are_skipped_by_the_estimate_and_no_study_database_is_written(tmp_path):
    import sqlite3

    from tunekit.config import load_recipe
    from tunekit.config.errors import TunekitError
    from tunekit.estimate.views import estimate as project
    from tunekit.report.load import load_study

    good = write_run(tmp_path / "runs", "good", reward=0.6)
    bad = write_run(tmp_path / "runs", "bad", reward=0.6)
    (bad / "steps.parquet").write_bytes(b"not parquet")
    (bad / "steps.jsonl").unlink(missing_ok=True)
    est = project(load_recipe(None), runs_dir=tmp_path / "runs", target_steps=100)
    assert [p.run_dir.name for p in est.runs] == ["good"] and est.skipped == 1
    # the table's figures add up by hand: what is paid once, and every step at the mean
    run = est.runs[0]
    assert run.wall_s == pytest.approx(run.one_time_s + run.run_steps * run.mean_step_s) and run.one_time_s > 0
    db = tmp_path / "plain.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE x (a)")
    with pytest.raises(TunekitError, match="not a study database"):
        load_study(f"sqlite:///{db}", None)
    with sqlite3.connect(db) as c:  # read, never given Optuna's tables
        assert [r[0] for r in c.execute("SELECT name FROM sqlite_master")] == ["x"]
    assert good.exists()


def test_a_search_json_written_before_it_kept_the_answer_so_far_still_draws_it():
    """A search.json of before (no ``best_so_far`` per trial): the report works the answer so far out by the
    search's own rule from the rows' reward intervals, rather than lose the line."""
    import json

    from tunekit.report.load import Records

    recorded = json.loads((Path(__file__).parent / "fixtures" / "recorded-search" / "search.json").read_text())
    assert not any("best_so_far" in t for t in recorded["trials"])
    hist = headline.search_history(Records(probes=[], searches=[recorded]), pd.DataFrame())["trials"]
    first = hist.loc[hist["category"] == "feasible", "value"].iloc[0]  # trial 0, the baseline, reaches it
    assert hist["best_so_far"].notna().all() and hist["best_so_far"].iloc[0] == pytest.approx(first)
    assert (hist["best_so_far"].diff().dropna() <= 0).all()  # the answer so far never gets dearer
    # by the search's rule, not the record's feasible flags: with every reading straddling the threshold, no trial
    # is feasible, and the cheapest within noise is still the answer so far
    thr = recorded["reward_threshold"]
    for t in recorded["trials"]:
        if t.get("reward_ci"):
            t["reward_ci"], t["feasible"] = [thr - 0.01, thr + 0.05], False
    hist = headline.search_history(Records(probes=[], searches=[recorded]), pd.DataFrame())["trials"]
    assert hist["best_so_far"].iloc[0] == pytest.approx(first) and hist["best_so_far"].notna().all()
