"""Evaluation on held-out prompts: which prompts are held out, and the curve the verdict reads (the builtin runner's
greedy evaluation itself is run in ``test_cli_probe.py``'s probe)."""

from __future__ import annotations

import json
import math
import random
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from tunekit import metrics
from tunekit.cli import app
from tunekit.config import TaskConfig, load_recipe
from tunekit.config.errors import ConfigError
from tunekit.workload import build_workload

cli = CliRunner()


def test_held_out_rows_are_the_same_for_every_seed_and_never_trained_on(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(50)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = TaskConfig(dataset=str(tmp_path / "d.jsonl"), eval_fraction=0.1)
    held = build_workload(task).eval_prompts(64)
    assert len(held) == 5 and [p.text for p in held] == [p.text for p in build_workload(task).eval_prompts(64)]
    w = build_workload(task)
    trained = {p.text for seed in range(20) for p in w.sample(45, random.Random(seed))}
    assert trained == {f"q{i}" for i in range(50)} - {p.text for p in held}
    assert [p.text for p in w.eval_prompts(2)] == [p.text for p in held[:2]]
    with pytest.raises(ConfigError, match="task.eval_fraction 0.99 holds out all 50 rows"):
        build_workload(TaskConfig(dataset=str(tmp_path / "d.jsonl"), eval_fraction=0.99))


def test_a_held_out_rows_reward_is_told_its_split_and_a_split_the_row_names_is_kept(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(40)]
    rows[0]["split"] = "validation"
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = build_workload(TaskConfig(dataset=str(tmp_path / "d.jsonl"), eval_fraction=0.5))
    held = {p.text: p.extra_info["split"] for p in w.eval_prompts(64)}
    trained = {p.text: p.extra_info["split"] for p in w.sample(200, random.Random(0))}
    assert set(trained.values()) <= {"train", "validation"} and "train" in trained.values()
    assert {s for t, s in held.items() if t != "q0"} == {"test"}
    assert held.get("q0", trained.get("q0")) == "validation"  # named by its row, held out or not


def test_a_prompt_the_file_repeats_is_held_out_with_every_row_of_it(tmp_path):
    rows = [{"prompt": f"q{i % 20}", "answer": str(i % 20)} for i in range(60)]  # each prompt three times
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = build_workload(TaskConfig(dataset=str(tmp_path / "d.jsonl"), eval_fraction=0.1))
    held = [p.text for p in w.eval_prompts(64)]
    trained = {p.text for seed in range(20) for p in w.sample(40, random.Random(seed))}
    assert len(held) == len(set(held)) == 2 and not trained & set(held) and len(trained) == 18


def test_a_row_without_its_answer_is_refused_naming_the_row(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)] + [{"prompt": "q5"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="row 5 has no 'answer'; give every row a value for task.answer_column"):
        build_workload(TaskConfig(dataset=str(tmp_path / "d.jsonl")))


def test_held_out_arithmetic_problems_are_never_drawn_for_training():
    w = build_workload(TaskConfig(max_operand=5, eval_fraction=0.25))  # 36 problems, 9 held out
    held = {p.text for p in w.eval_prompts(64)}
    assert len(held) == 9 and all(p.endswith("=") for p in held)
    drawn = {p.text for p in w.sample(2000, random.Random(1))}
    assert drawn.isdisjoint(held) and len(drawn) == 36 - 9
    # without a held-out share a seed draws what it drew before held-out prompts existed
    assert [p.text for p in build_workload(TaskConfig()).sample(3, random.Random(0))] == ["12+13=", "8+16=", "12+9="]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_an_evaluation_file_is_what_evaluation_reads_and_training_keeps_every_row(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)])
    # verl's test file: its own rows (one of them twice, one also trained on), a split the row names
    test = [{"prompt": f"t{i}", "answer": str(i)} for i in range(100)] + [{"prompt": "t3", "answer": "3"},
                                                                          {"prompt": "q0", "answer": "0"}]
    evals = write_rows(tmp_path / "test.parquet.jsonl", test)
    task = TaskConfig(dataset=train, eval_dataset=evals)
    w = build_workload(task)
    held = [p.text for p in w.eval_prompts(1000)]
    assert sorted(held) == sorted({r["prompt"] for r in test})  # each distinct prompt once
    assert held != sorted(held, key=lambda t: int(t[1:])) and held == [p.text for p in build_workload(task).eval_prompts(1000)]
    assert [p.text for p in w.eval_prompts(64)] == held[:64]  # the first 64 are a sample, the same every time
    assert {p.extra_info["split"] for p in w.eval_prompts(1000)} == {"test"}
    assert {p.data_source for p in w.eval_prompts(1000)} == {"test.parquet"}  # the file's stem
    trained = {p.text for seed in range(20) for p in w.sample(30, random.Random(seed))}
    assert trained == {f"q{i}" for i in range(30)}  # nothing taken out of training, q0 included


@pytest.mark.parametrize("rows, words", [
    (None, "task.eval_dataset '{path}' does not exist"),
    ([{"question": "t0", "answer": "0"}], "task.eval_dataset '{path}' has no column 'prompt'"),
    ([{"prompt": "t0", "answer": "0"}, {"prompt": "t1"}], "row 1 has no 'answer'"),
])
def test_a_bad_evaluation_file_is_refused_naming_its_key(tmp_path, rows, words):
    train = write_rows(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)])
    path = str(tmp_path / "test.jsonl") if rows is None else write_rows(tmp_path / "test.jsonl", rows)
    with pytest.raises(ConfigError, match=re.escape(words.format(path=path))) as e:
        build_workload(TaskConfig(dataset=train, eval_dataset=path))
    assert "task.eval_dataset" in str(e.value)


def test_an_evaluation_file_of_training_prompts_is_refused_and_a_partial_overlap_said_once(tmp_path, capsys):
    from tunekit.workload import check_workload
    from tunekit.workload.chat import say_once

    train = write_rows(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)])
    copied = write_rows(tmp_path / "copied.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(0, 30, 3)])
    with pytest.raises(ConfigError, match=r"task.eval_dataset .*copied.jsonl'.*each of its 10 prompts is also one of "
                                          r"task.dataset"):
        check_workload(TaskConfig(dataset=train, eval_dataset=copied))
    half = write_rows(tmp_path / "half.jsonl", [{"prompt": p, "answer": "1"} for p in ("q1", "q2", "t1", "t2", "t3")])
    say_once.cache_clear()
    for _ in range(2):
        check_workload(TaskConfig(dataset=train, eval_dataset=half))
    err = capsys.readouterr().err
    assert err.count("2 of the 5 prompts of task.eval_dataset are also in task.dataset") == 1


def test_an_evaluation_file_alone_turns_evaluation_on_and_both_sources_are_refused(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)])
    evals = write_rows(tmp_path / "test.jsonl", [{"prompt": "t0", "answer": "0"}])
    on = load_recipe(None, [f"task.dataset={train}", f"task.eval_dataset={evals}", "probe.eval_every=2"])
    assert on.evaluates and not load_recipe(None, [f"task.dataset={train}"]).evaluates
    res = cli.invoke(app, ["probe", "--set", f"task.eval_dataset={evals}", "--set", "task.eval_fraction=0.1",
                           "--set", "probe.eval_every=2", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "set either task.eval_fraction" in " ".join(res.output.split()), res.output
    assert not (tmp_path / "o").exists()
    res = cli.invoke(app, ["probe", "--set", f"task.eval_dataset={evals}", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "evaluation needs both probe.eval_every" in " ".join(res.output.split())


def test_a_recipe_made_path_independent_keeps_a_shipped_dataset_and_anchors_the_evaluation_file(tmp_path):
    from pathlib import Path

    r = load_recipe(None, ["task.dataset=tunekit:arith-qa", "task.eval_dataset=test.jsonl", "probe.eval_every=2"])
    moved = r.with_absolute_paths(tmp_path)
    assert moved.task.dataset == "tunekit:arith-qa" and Path(moved.task.eval_dataset) == tmp_path.resolve() / "test.jsonl"


def test_evaluation_needs_both_knobs_and_says_so(tmp_path):
    res = cli.invoke(app, ["probe", "--set", "search.reward_metric=eval/reward_mean", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "probe.eval_every" in res.output and "task.eval_fraction" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sets, words", [
    (["task.eval_fraction=0.1"], "evaluation needs both probe.eval_every"),  # held out, never evaluated
    (["probe.eval_every=10", "task.eval_fraction=0.1", "probe.steps=4"], "probe.eval_every 10 is more than probe.steps 4"),
    (["probe.eval_every=10", "task.eval_fraction=0.1", "search.probe_steps=6"],
     "probe.eval_every 10 is more than search.probe_steps 6"),
])
def test_an_evaluation_no_probe_would_run_is_refused_naming_the_keys(tmp_path, sets, words):
    res = cli.invoke(app, ["search", "--budget-yuan", "1", "--out", str(tmp_path / "s"), *(a for k in sets for a in ("--set", k))])
    assert res.exit_code == 2 and words in " ".join(res.output.split()), res.output
    assert not (tmp_path / "s").exists()


def test_the_reward_curve_holds_each_steps_latest_evaluation():
    steps = pd.DataFrame({"step": range(6), "reward/mean": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                          "eval/reward_mean": [None, 0.5, None, 0.75, None, None]})
    curve = metrics.reward_curve(steps, "eval/reward_mean")
    assert math.isnan(curve[0]) and curve[1:] == [0.5, 0.5, 0.75, 0.75, 0.75]
    assert metrics.last_window(curve, 10) == [0.5, 0.5, 0.75, 0.75, 0.75]
    assert metrics.reward_curve(steps) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert metrics.reward_curve(steps.drop(columns="eval/reward_mean"), "eval/reward_mean") == []


def test_the_verdict_reads_the_metric_the_search_names(tmp_path):
    from tunekit.estimate.profiles import load_profile
    from tunekit.search.measure import read_probe

    rows = [{"step": i, "timing_s/step": 1.0, "reward/mean": 0.2,
             "eval/reward_mean": 0.9 if i % 5 == 4 else None} for i in range(20)]
    pd.DataFrame(rows).to_parquet(tmp_path / "steps.parquet")
    summary = {"status": "ok", "wall_s": 30.0, "startup_s": 5.0}
    sets = ["search.reward_threshold=0.5", "run.until=threshold", "probe.eval_every=5", "task.eval_fraction=0.1"]
    held_out = read_probe(load_recipe(None, [*sets, "search.reward_metric=eval/reward_mean"]), tmp_path, summary,
                          load_profile("cpu"))
    trained = read_probe(load_recipe(None, sets), tmp_path, summary, load_profile("cpu"))
    # the held-out reward (0.9 from step 4 on) reaches the threshold once a 10-step window holds it: step 14
    assert held_out.reward.value == pytest.approx(0.9) and held_out.verdict(0.5) == "feasible"
    assert held_out.length.steps == 14 and held_out.rewards == [0.2] * 20  # the learning checks keep the batch's
    assert trained.reward.value == pytest.approx(0.2) and trained.verdict(0.5) == "infeasible"
    # the window repeats one evaluation of 44 held-out prompts: its interval is theirs, not the repeats' zero width
    assert held_out.window == [0.9, 0.9] and held_out.reward.low < 0.85 and held_out.reward.high < 1.0
    rows = [r | {"eval/reward_mean": 0.55 if r["eval/reward_mean"] else None} for r in rows]
    pd.DataFrame(rows).to_parquet(tmp_path / "steps.parquet")
    near = read_probe(load_recipe(None, [*sets, "search.reward_metric=eval/reward_mean"]), tmp_path, summary,
                      load_profile("cpu"))
    assert near.reward.value == pytest.approx(0.55) and near.verdict(0.5) == "within noise"


def test_an_evaluation_scores_each_held_out_prompt_once_and_keeps_every_answer(tmp_path):
    """The last batch of an evaluation is filled up with repeats of its prompts: they are generated with the rest
    (a batch of one size), never scored, so an expensive reward (a judge) is asked once per held-out prompt; each
    scored answer lands in eval_samples.parquet under the steps trained."""
    from types import SimpleNamespace

    import torch

    from tunekit.rundir import EVAL_SAMPLES, EvalSampleLog, read_samples
    from tunekit.trainer.build import load_tokenizer
    from tunekit.trainer.loop import Trainer

    r = load_recipe(None, ["task.max_operand=5", "task.eval_fraction=0.25", "probe.eval_every=1",
                           "system.batch.prompts_per_step=8", "system.batch.micro_batch_size=8"])
    task, tok, scored = build_workload(r.task), load_tokenizer(r), []
    held = [p.text for p in task.eval_prompts(r.probe.eval_prompts)]  # 9 of the 36 problems: two batches of 8

    def generate(enc, seed, greedy):
        return torch.full((enc["prompt_ids"].shape[0], 2), tok.eos_token_id), None

    def score(prompts, texts):
        scored.extend(p.text for p in prompts)
        return torch.tensor([float(i % 2) for i in range(len(prompts))])

    me = SimpleNamespace(r=r, task=task, tok=tok, shard_world=1, batch_cfg=r.system.batch,
                         dist=SimpleNamespace(rank=0, world=1, mean=float), eval_samples=EvalSampleLog(tmp_path),
                         roles=SimpleNamespace(rollout=SimpleNamespace(generate=generate), reward=SimpleNamespace(score=score)))
    me.responses = lambda batch: Trainer.responses(me, batch)
    me.evaluation = lambda trained: Trainer.evaluation(me, trained)
    out = Trainer.evaluate(me, 2)  # after the third step
    assert len(held) == 9 and sorted(scored) == sorted(held)
    # the first batch's 8 answers score 0,1,0,1,...; the second's one 0: 4 of 9
    assert out["eval/reward_mean"] == pytest.approx(4 / 9)
    kept = read_samples(tmp_path, EVAL_SAMPLES)
    assert sorted(kept["prompt"]) == sorted(held) and set(kept["trained_steps"]) == {3}
    assert kept["reward"].sum() == 4 and kept["response"].tolist() == [""] * 9
