"""Report data functions on synthetic run directories: table, Pareto front, differences, headline, history, gaps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pandas as pd
import pytest
from report_synth import write_run, write_search

from tunekit.config import load_recipe
from tunekit.errors import TunekitError
from tunekit.report import data, series
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


def test_best_so_far_ignores_infeasible_and_missing_values():
    assert data.best_so_far([5.0, 3.0, None, 4.0, 2.0], [True, False, True, True, True]) == [5.0, 5.0, 5.0, 4.0, 2.0]
    assert data.best_so_far([3.0], [None]) == [None]


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
    assert df["label"].tolist() == ["P01", "P00", "P03", "P02"]
    assert df["category"].tolist() == ["feasible", "feasible", "infeasible", "failed"]
    assert df.loc[df.label == "P02", "reason"].item() == "CUDA out of memory"
    assert math.isnan(df.loc[df.label == "P02", "projected_yuan"].item())
    varying = data.varying_knobs(df, knobs)
    assert set(varying) == {"knob:system.batch.micro_batch_size", "knob:system.memory.param_offload"}
    assert "knob:algorithm.name" in knobs and "knob:algorithm.name" not in varying


def test_probe_reward_reads_the_recipes_window(tmp_path):
    run = write_run(tmp_path, "r", reward=0.8, overrides=("search.reward_window=1",))
    probe = load_records([run]).probes[0]
    assert data.probe_reward(probe) == pytest.approx(probe.steps["reward/mean"].iloc[-1])


def test_cost_reward_points_front_and_threshold(runs):
    df, _ = data.probe_table(load_records([runs[0].parent]))
    cr = data.cost_reward(df)
    assert cr["threshold"] == 0.5  # the recipe default
    assert cr["unplotted"] == ["P02"]
    assert cr["front"] == ["P03", "P01", "P00"]  # each cheaper step up buys more reward; the OOM is never on it


def test_headline_without_search_uses_cheapest_feasible_and_first_probe_as_baseline(runs):
    records = load_records([runs[0].parent])
    df, knobs = data.probe_table(records)
    h = data.headline(records, df, knobs)
    assert h["best"]["label"] == "P01" and h["baseline"]["label"] == "P00"
    assert h["saving_yuan"] == pytest.approx(8.0) and h["saving_pct"] == pytest.approx(40.0)
    assert h["changes"] == [("system.batch.micro_batch_size", load_recipe(None).system.batch.micro_batch_size, 4)]
    assert h["command"].endswith(f"{runs[1].resolve()}/config.yaml --steps 1000")
    assert h["counts"] == {"ok": 3, "oom": 1}


@pytest.mark.parametrize("legacy", [False, True])
def test_headline_prefers_search_json(runs, legacy):
    write_search(runs[0].parent.parent, runs, best=0, baseline=1, saving_yuan=-8.0, saving_pct=-66.0, legacy=legacy)
    records = load_records([runs[0].parent.parent])
    df, knobs = data.probe_table(records)
    h = data.headline(records, df, knobs)
    assert (h["best"]["label"], h["baseline"]["label"], h["saving_yuan"], h["command"]) == ("P00", "P01", -8.0, "tunekit probe --recipe best.yaml")
    assert h["source"] == "search.json"


def test_headline_when_nothing_is_feasible(tmp_path):
    write_run(tmp_path, "a", reward=0.3)
    write_run(tmp_path, "b", reward=0.4, seed=1)
    records = load_records([tmp_path])
    df, knobs = data.probe_table(records)
    h = data.headline(records, df, knobs)
    assert h["best"] is None and h["top_reward"]["label"] == "P01"


@pytest.mark.parametrize("legacy", [False, True])
def test_search_history_from_search_json_maps_runs_to_labels(runs, legacy):
    write_search(runs[0].parent.parent, runs, best=1, baseline=0, legacy=legacy)
    records = load_records([runs[0].parent.parent])
    df, _ = data.probe_table(records)
    hist = data.search_history(records, df)
    t = hist["trials"]
    assert hist["source"] == "search.json"
    assert t["label"].tolist() == ["P00", "P01", "P02", "P03"]
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
    hist = data.search_history(records, df)
    assert hist["source"] == "Optuna study s1"
    assert hist["trials"]["feasible"].tolist() == [True, True, False, False]
    assert hist["trials"]["best_so_far"].tolist() == [20.0, 12.0, 12.0, 12.0]
    imp = data.importance(records)
    assert set(imp["values"]) == {"mb", "offload"} and sum(imp["values"].values()) == pytest.approx(1.0)


def test_importance_says_why_not(tmp_path, runs):
    storage = f"sqlite:///{tmp_path / 'one.db'}"
    optuna.create_study(storage=storage, study_name="one").add_trial(optuna.trial.create_trial(value=1.0))
    records = load_records([runs[0].parent], storage=storage, study="one")
    assert records.study.importance is None and "1 complete trial" in data.importance(records)["note"]
    assert "no Optuna study" in data.importance(load_records([runs[0].parent]))["note"]


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
    (tmp_path / "search.json").write_text(json.dumps({"equivalence": ["P01 and P00 differ in reward", {"pair": "P00/P02"}]}))
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    v = data.policy_verdicts(records, df)
    assert v["probes"]["verdict"].tolist() == ["on-policy", "off-policy", "off-policy", "not measured"]
    assert "1 step(s) stale" in v["probes"]["why"][1] and "0.4 > 0.05" in v["probes"]["why"][2]
    assert v["warnings"] == ["P01 and P00 differ in reward", "pair: P00/P02"]


def test_missing_columns_and_files_are_listed_not_fatal(tmp_path):
    write_run(tmp_path, "a-new")
    write_run(tmp_path, "b-old", drop_summary=("steady", "cost/projected_yuan"), drop_steps=("timing_s/step",), nvml_samples=0)
    (tmp_path / "b-old" / "config.yaml").unlink()
    nosteps = write_run(tmp_path, "c-nosteps", seed=2)
    (nosteps / "steps.parquet").unlink()
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    notes = data.missing_notes(records, df)
    assert "no config.yaml: P01" in notes
    assert "summary.json has no steady: P01" in notes and "summary.json has no cost/projected_yuan: P01" in notes
    assert "steps.parquet has no column timing_s/step: P01" in notes
    assert "no steps.parquet: P02" in notes
    assert not any("nvml" in n for n in notes)  # NVML absent on a probe that had none is not news
    # the old probe still gets step times from steps.parquet (steady fallback), minus the missing step column
    times = series.phase_times({"P01": records.probes[1]})
    assert times.loc["P01", "gen"] > 0


def test_no_runs_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TunekitError, match="has no probe runs"):
        load_records([tmp_path / "empty"])
    with pytest.raises(TunekitError, match="does not exist"):
        load_records([tmp_path / "absent"])


def test_series_memory_per_gpu_with_roles(tmp_path):
    run = write_run(tmp_path, "two", gpus=2, overrides=("system.device_map={actor: [0], critic: [0], ref: [1], rollout: [1], reward: [1]}",))
    probe = load_records([run]).probes[0]
    mem = series.memory({"P00": probe})
    assert mem["series"].tolist() == ["allocator allocated", "allocator reserved", "NVML GPU 0", "NVML GPU 1"]
    assert mem.set_index("series").loc["NVML GPU 1", "roles"] == "ref, rollout, reward"
    comm = series.comm_phases({"P00": probe})
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
    h = data.headline(records, df, knobs)
    assert h["best"]["label"] == "P01" and h["saving_yuan"] is None and h["notes"] == ["the baseline did not reach the threshold"]


def test_learning_mismatch_marks_both_probes_in_red(runs):
    sentence = "trials 0 and 1 differ only in system.batch.micro_batch_size but their reward differs"
    write_search(runs[0].parent.parent, runs, best=1, baseline=0, learning={
        "pairs_compared": 1, "method": "z-test", "mismatches": [{"trial_a": 0, "trial_b": 1, "sentence": sentence}]})
    records = load_records([runs[0].parent.parent])
    df, _ = data.probe_table(records)
    v = data.policy_verdicts(records, df)
    rows = v["probes"].set_index("label")
    assert rows.loc["P00", "verdict"] == rows.loc["P01", "verdict"] == "off-policy"
    assert rows.loc["P00", "why"] == "learns differently from trial 1"
    assert rows.loc["P03", "verdict"] == "off-policy" and rows.loc["P02", "verdict"] == "on-policy"
    assert v["warnings"] == [sentence] and v["checks"][0].startswith("1 pair(s)")


def test_cpu_probes_are_not_missing_gpu_memory(tmp_path):
    write_run(tmp_path, "cpu", nvml_samples=0, drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    write_run(tmp_path, "gpu", drop_steps=("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"))
    records = load_records([tmp_path])
    df, _ = data.probe_table(records)
    assert data.missing_notes(records, df) == ["summary.json steady has no perf/max_memory_reserved_gb: P01"]
