"""The run directory's readers see what its writers wrote, including what a killed probe leaves."""

from __future__ import annotations

import json

import pandas as pd

from tunekit import rundir
from tunekit.config import ProbeConfig, load_recipe


def test_a_killed_probe_leaves_readable_steps(tmp_path):
    log = rundir.StepLog(tmp_path)
    for step in range(3):
        log.append({"step": step, "timing_s/step": 0.5 + step})
    assert not (tmp_path / rundir.STEPS).exists()  # never flushed: the process died
    with (tmp_path / rundir.STEPS_LIVE).open("a") as f:
        f.write('{"step": 3, "timing_s/st')  # a line cut off mid-write
    assert rundir.steps_done(tmp_path) == 4
    assert [r["timing_s/step"] for r in rundir.live_rows(tmp_path)] == [0.5, 1.5, 2.5]
    log.flush()
    assert rundir.read_steps(tmp_path)["step"].tolist() == [0, 1, 2]


def test_steps_after_the_last_flush_are_read_from_the_json_lines(tmp_path):
    log = rundir.StepLog(tmp_path)
    for step in range(12):
        log.append({"step": step, "timing_s/step": 1.0 + step})
        if step == 9:
            log.flush()  # the trainer writes the parquet every ten steps; the probe was stopped at step 12
    assert len(pd.read_parquet(tmp_path / rundir.STEPS)) == 10
    assert rundir.read_steps(tmp_path)["step"].tolist() == list(range(12))
    log.flush()
    (tmp_path / rundir.STEPS_LIVE).unlink()  # a finished run's parquet alone is read as it is
    assert rundir.read_steps(tmp_path)["timing_s/step"].tolist()[-1] == 12.0


def test_a_runners_own_config_inside_a_run_directory_is_no_run(tmp_path):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        rundir.write_config(runs / name, load_recipe(None, []))
    hydra = runs / "a" / "verl" / "outputs" / "2026-12-01" / "04-35-57" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / rundir.CONFIG).write_text("actor_rollout_ref: {}\n")  # verl's Hydra record of its own config
    assert rundir.find_run_dirs(runs) == [runs / "a", runs / "b"]
    assert rundir.find_configs(runs) == [runs / "a" / rundir.CONFIG, runs / "b" / rundir.CONFIG]
    assert rundir.find_run_dirs(runs / "a") == [runs / "a"]


def test_config_round_trip_and_errors_in_rank_order(tmp_path):
    r = load_recipe(None, ["probe.steps=7", "algorithm.name=grpo", "system.batch.samples_per_prompt=4"])
    rundir.write_config(tmp_path, r)
    assert rundir.read_config(tmp_path).model_dump() == r.model_dump()
    rundir.write_error(tmp_path, 1, {"status": "oom", "message": "b"})
    rundir.write_error(tmp_path, 0, {"status": "failed", "message": "a"})
    assert [e["message"] for e in rundir.read_errors(tmp_path)] == ["a", "b"]
    assert rundir.read_result(tmp_path) is None and rundir.read_summary(tmp_path) is None


def test_summary_is_written_whole(tmp_path):
    rundir.write_summary(tmp_path, {"status": "ok", "wall_s": 1.5})
    assert json.loads((tmp_path / rundir.SUMMARY).read_text()) == {"status": "ok", "wall_s": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == [rundir.SUMMARY]  # no temporary file left behind
    assert "ok" in rundir.STATUSES and "running" in rundir.STATUSES


def test_lenient_reading_of_a_broken_run_dir_says_what_is_missing(tmp_path):
    root, tmp_path = tmp_path, tmp_path / "runs" / "broken"
    tmp_path.mkdir(parents=True)
    (tmp_path / rundir.SUMMARY).write_text("{not json")
    log = rundir.StepLog(tmp_path)
    log.append({"step": 0, "reward/mean": 0.5})  # a probe killed before its first flush: jsonl only
    files = rundir.read_lenient(tmp_path)
    assert files.summary == {} and files.config == {}
    assert list(files.steps["reward/mean"]) == [0.5]
    assert files.missing == ["summary.json unreadable (JSONDecodeError)", "no config.yaml"]  # no NVML: not news
    assert rundir.find_run_dirs(root) == [tmp_path]


def test_samples_keep_the_first_and_last_five_steps_and_every_tenth(tmp_path):
    log = rundir.SampleLog(tmp_path, ProbeConfig(steps=100, samples_per_step=3))
    for step in range(100):
        n = 12
        log.add(step, [f"p{step}.{i}" for i in range(n)], [f"r{i}" for i in range(n)], ["a"] * n, [0.5] * n)
    samples = rundir.read_samples(tmp_path)
    kept = [0, 1, 2, 3, 4, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 96, 97, 98, 99]
    assert sorted(set(samples["step"])) == kept and len(samples) == 3 * len(kept)
    assert samples[samples["step"] == 20]["prompt"].tolist() == ["p20.0", "p20.4", "p20.8"]  # spread over the batch
    assert list(samples.columns) == list(rundir.SAMPLE_COLUMNS)
    off = rundir.SampleLog(tmp_path / "off", ProbeConfig(steps=3, samples_per_step=0))
    off.add(0, ["p"], ["r"], ["a"], [1.0])
    assert not (tmp_path / "off").exists() and rundir.read_samples(tmp_path / "off").empty


def test_a_step_logged_as_a_float_is_written_as_an_integer(tmp_path):
    log = rundir.StepLog(tmp_path)  # TRL's callback logs its steps as floats
    for step in range(2):
        log.append({"step": float(step), "timing_s/step": 0.5})
    log.flush()
    assert str(pd.read_parquet(tmp_path / rundir.STEPS)["step"].dtype) == "int64"
