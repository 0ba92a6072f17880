"""`tunekit probe` end to end on the embedded default, and its bad-input contract."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from tunekit import metrics, rundir
from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.trainer.initial_responses import sample_responses
from tunekit.workload import Prompt, build_workload

runner = CliRunner()
SMALL = ["--set", "system.batch.prompts_per_step=8", "--set", "system.batch.micro_batch_size=8"]


@pytest.mark.slow  # a probe: about 12 s on 2 cores
def test_probe_writes_run_records(tmp_path, monkeypatch):
    written = []  # every summary.json the launcher writes, the running one first
    write_summary = rundir.write_summary
    monkeypatch.setattr(rundir, "write_summary", lambda run_dir, s: (written.append(dict(s)), write_summary(run_dir, s)))
    evaluate = ["--set", "probe.eval_every=2", "--set", "task.eval_fraction=0.05", "--set", "search.reward_metric=eval/reward_mean"]
    # sampled below temperature 1: the actor's logprobs must divide the logits by it as the rollout did
    res = runner.invoke(app, ["probe", "--steps", "4", "--seed", "1", "--out", str(tmp_path), *SMALL, *evaluate,
                              "--set", "task.temperature=0.7"])
    assert res.exit_code == 0, res.output
    (run,) = list(tmp_path.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    # the start key from the launch on (a probe stopped part-way lends its cold start by it), the same as at the end
    assert written[0]["status"] == "running" and written[0]["startup/start_key"] == summary["startup/start_key"]
    # the first step left its start-up in the run directory as it ended, as the result then said it
    started = rundir.read_startup(run)
    assert started["startup_s"] == pytest.approx(summary["startup_s"]) and "steady" not in started
    assert summary["status"] == "ok" and summary["steps"] == 4
    assert f"run dir: {run}\n" in res.output  # whole on one line to copy, however long the path
    assert "perf/throughput" in res.output and "median timing_s/step" in res.output
    assert 0.0 <= summary["reward_first10"] <= 1.0 and summary["wall_s"] > 0
    assert summary["cost/projected_yuan"] > summary["cost/probe_yuan"] > 0
    # start-up from the launch, its parts inside it, and the first step against the steady ones
    parts = summary["startup/launch_s"] + summary["startup/model_load_s"] + summary["startup/engine_start_s"]
    assert 0 < summary["startup/model_load_s"] and parts <= summary["startup_s"] < summary["wall_s"]
    first = pd.read_parquet(run / "steps.parquet")["timing_s/step"][0]
    assert summary["first_step/step_s"] == pytest.approx(first)
    assert summary["first_step/excess_s"] == pytest.approx(first - summary["steady"]["timing_s/step"])
    # the first probe in its directory starts cold: its run pays its own one-time cost
    assert summary["cost/overhead_source"] == "own"
    assert summary["cost/priced_overhead_s"] == summary["cost/own_overhead_s"] > 0
    if not torch.cuda.is_available():  # priced per CPU rank, holding no GPU
        assert summary["gpus_held"] == 0 and summary["devices_held"] == 1
        # the auto knobs on CPU: the plain module, not compiled; the table says so too
        assert (summary["resolved/fsdp"], summary["resolved/compile"]) == (False, False)
        assert "resolved/compile" in res.output
    steps = pd.read_parquet(run / "steps.parquet")
    # the probe's own overhead: the profiler's time over all steps; one rank generating in its own process has no
    # collectives, so no step is profiled for communication (a torch.profiler window would only slow it)
    assert summary["profiler/overhead_s"] == pytest.approx(steps["profiler/overhead_s"].sum())
    assert 0 < summary["profiler/overhead_share"] < 0.05
    assert summary["comm/method"] == "not measured (one rank: no collectives)" and "comm/sampled" not in steps.columns
    for col in ("step", "reward/mean", "timing_s/gen", "timing_s/values", "timing_s/adv",
                "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights", "timing_s/step",
                "rollout/logprob_abs_diff_mean"):
        assert col in steps.columns, col
    assert list(steps["step"]) == [0, 1, 2, 3]
    # the rollout's throughput over its phase, as TRL's and verl's are read: the batch's response tokens a second
    batch = rundir.read_config(run).system.batch
    tokens = steps["response_length/mean"] * batch.prompts_per_step * batch.samples_per_prompt
    assert steps["rollout/tokens_per_s"].tolist() == pytest.approx((tokens / steps["timing_s/gen"]).tolist(), rel=1e-6)
    # every name is the schema's, verl's where verl has one (a PPO probe: the actor's and the critic's)
    assert metrics.unknown(steps.columns) == [] and metrics.unknown(metrics.summary_metrics(summary)) == []
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm", "critic/vf_loss"} <= set(steps.columns)
    assert summary["runner"] == "builtin"
    # what the model said: four responses a step (every step of a short probe), each scored as the step was
    samples = rundir.read_samples(run)
    assert samples["step"].tolist() == [s for s in range(4) for _ in range(4)]
    assert samples["prompt"].str.endswith("=").all() and samples["reward"].between(0, 1).all()
    assert samples["answer"].str.fullmatch(r"\d+").all()
    # each response kept with its own prompt and the reward it got: the task scores them so again
    task = build_workload(load_recipe(None).task)
    again = [task.score(Prompt(text=r.prompt, answer=r.answer), r.response) for r in samples.itertuples()]
    assert again == pytest.approx(samples["reward"].tolist())
    assert samples["response"].nunique() > 1  # not one response repeated
    assert "samples of step 3" in res.output
    # greedy answers to the held-out prompts after steps 1 and 3, outside the steps' time
    assert steps["eval/reward_mean"].notna().tolist() == [False, True, False, True]
    # the summary and the printed table carry the first and the last evaluation
    assert summary["eval/evaluations"] == 2 and summary["eval/reward_last"] == steps["eval/reward_mean"].iloc[3]
    assert summary["eval/reward_first"] == steps["eval/reward_mean"].iloc[1] and "eval/reward_last" in res.output
    assert steps["eval/reward_mean"].dropna().between(0, 1).all() and (steps["eval/time_s"].dropna() > 0).all()
    # the embedded warm model answers held-out sums better greedily than it samples at temperature 1
    assert steps["eval/reward_mean"].dropna().mean() > steps["reward/mean"].mean()
    held = {p.text for p in build_workload(load_recipe(str(run / "config.yaml")).task).eval_prompts(64)}
    assert not set(samples["prompt"]) & held
    # and once before the first step (probe.eval_before_train), inside the start-up: the untrained model's reading
    assert 0 < summary["startup/eval_before_s"] < summary["startup_s"] and "eval/reward_before" in res.output
    # every greedy answer of each evaluation is kept, its mean the evaluation's reward
    answers = rundir.read_samples(run, rundir.EVAL_SAMPLES)
    assert answers["trained_steps"].tolist() == [t for t in (0, 2, 4) for _ in held]
    assert set(answers["prompt"]) == held and "held-out answers after 4 steps" in res.output
    means = answers.groupby("trained_steps")["reward"].mean()
    assert means[0] == pytest.approx(summary["eval/reward_before"])
    assert [means[2], means[4]] == pytest.approx(steps["eval/reward_mean"].dropna().tolist())
    # the hf backend samples with the actor itself: rollout and recomputed logprobs agree
    assert steps["rollout/logprob_abs_diff_mean"].max() < 1e-3
    # one epoch, one mini-batch, no KL penalty: the update's forward is on-policy, so no old-logprob pass and no reference
    assert "timing_s/old_logprob" not in steps.columns
    assert "timing_s/ref" not in steps.columns and "actor/ref_kl" not in steps.columns
    assert "probe:\n  steps: 4" in (run / "config.yaml").read_text()
    # before any probe, the cost model can sample the initial policy's responses: with all of the first step's
    # prompts on the trainer's device they are that step's own, ending at the end-of-sequence token within the budget
    recorded = load_recipe(str(run / "config.yaml"))
    sample = sample_responses(recorded, recorded.system.batch.prompts_per_step)
    assert sample.tokens == steps["response_length/mean"][0] < recorded.task.max_new_tokens


@pytest.mark.slow
def test_an_off_policy_update_with_a_kl_penalty_recomputes_old_logprobs_and_runs_the_reference(tmp_path):
    """Two epochs over two mini-batches of 16 (32 samples), with a KL penalty: the update runs off-policy and the
    penalty needs the reference. Which of these alone asks for the old logprobs is
    test_actor_loss's check; the on-policy case (one epoch, one mini-batch, no KL) is the default probe of
    test_probe_writes_run_records, which runs neither phase."""
    sets = ["algorithm.ppo_epochs=2", "system.batch.mini_batch_size=16", "algorithm.kl_coef=0.05"]
    args = ["probe", "--steps", "2", "--out", str(tmp_path)] + [a for s in sets for a in ("--set", s)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (run,) = list(tmp_path.iterdir())
    steps = pd.read_parquet(run / "steps.parquet")
    assert "timing_s/old_logprob" in steps.columns
    assert "timing_s/ref" in steps.columns and "actor/ref_kl" in steps.columns
    # the on-policy check is logged either way, and the hf backend samples with the actor itself
    assert steps["rollout/logprob_abs_diff_mean"].max() < 1e-3


@pytest.mark.parametrize("sets, has_ref", [
    ([], False), (["algorithm.ppo_epochs=2"], False), (["system.batch.mini_batch_size=16"], False),
    (["algorithm.kl_coef=0.05"], True),
])
def test_only_a_kl_penalty_brings_the_reference_role(sets, has_ref):
    """An off-policy update alone runs no reference: the probe above has a KL penalty, the default probe none."""
    assert ("ref" in load_recipe(None, sets).roles) == has_ref


@pytest.mark.slow  # a probe: about 12 s on 2 cores
def test_grpo_probe_has_no_critic_and_its_kl_is_a_loss_term_by_default(tmp_path):
    res = runner.invoke(app, ["probe", "--recipe", "tiny-grpo", "--steps", "2", "--out", str(tmp_path),
                              "--set", "algorithm.kl_coef=0.05"])
    assert res.exit_code == 0, res.output
    (run,) = list(tmp_path.iterdir())
    steps = pd.read_parquet(run / "steps.parquet")
    assert "timing_s/update_critic" not in steps.columns and "timing_s/update_actor" in steps.columns
    # the reference runs; the KL acts in the actor's loss (k3, >= 0), so no old-logprob pass is needed before it
    assert "timing_s/ref" in steps.columns and "timing_s/old_logprob" not in steps.columns
    assert (steps["actor/kl_loss"] >= 0).all() and steps["actor/ref_kl"].notna().all()


@pytest.mark.parametrize("args, words", [
    (["--recipe", "does-not-exist"], "not found"),
    (["--steps", "0"], "probe.steps"),
    (["--steps", "-3"], "probe.steps"),
    (["--set", "nope=1"], "no such key"),
    (["--set", "model.preset=qwen9"], "model.preset 'qwen9' is not a preset"),
    (["--set", "model.path=/no/such/dir"], "model.path '/no/such/dir' does not exist"),
    (["--set", "system.device=cuda", "--set", "system.device_map={actor: [3], critic: [3], ref: [3], rollout: [3], reward: [3]}"], "GPU 3"),
    (["--set", "system.device_map={actor: [0], critic: [0], ref: [0], reward: [0]}"], "device_map.rollout is missing"),
    (["--set", "system.memory.param_offload=true"], "system.memory.param_offload is true but the probe runs on CPU"),
])
def test_bad_input_is_one_sentence_exit_2_nothing_written(tmp_path, args, words):
    out = tmp_path / "runs"
    res = runner.invoke(app, ["probe", "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize("command", [["probe", "--steps", "1"], ["search", "--budget-yuan", "1", "--trials", "2"],
                                     ["loadtest", "--url", "http://127.0.0.1:9"]])
def test_an_out_that_is_a_file_is_one_sentence_exit_2(tmp_path, command):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    for out in (taken, taken / "runs"):
        res = runner.invoke(app, [*command, "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert " ".join(res.output.split()) == f"error: --out {out}: {taken} is a file, not a folder; give a folder (made if it does not exist)."
    assert taken.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [taken]


def test_recipes_and_profiles_list():
    res = runner.invoke(app, ["recipes"], env={"COLUMNS": "80"})
    assert res.exit_code == 0 and "tiny-grpo" in res.output
    # at 80 columns each recipe's name is whole at the start of a line and its description reads as a sentence
    lines = res.output.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    assert any(line.startswith("smollm2-arith  algorithm grpo · model smollm2-135m") for line in lines)
    assert "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to bf16) learns word-problem arithmetic" in " ".join(res.output.split())
    res = runner.invoke(app, ["profiles"], env={"COLUMNS": "80"})
    assert res.exit_code == 0 and "h100-80g" in res.output
    # memory and peak: one spelling for unknown
    assert "cpu GPU pattern - (matches no GPU) · memory GiB unknown · peak bf16 TFLOP/s unknown" in " ".join(res.output.split())
    assert "None" not in res.output


@pytest.mark.parametrize("command", [c.name or c.callback.__name__ for c in app.registered_commands])
def test_help_shows_switches_as_plain_flags(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    switches = [line for line in res.output.splitlines() if "--resume" in line or "--keys" in line]
    assert all("<bool>" not in line for line in switches), switches  # they take no value


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n"])
def test_an_empty_recipe_file_is_refused(tmp_path, text):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(text)
    out = tmp_path / "runs"
    res = runner.invoke(app, ["probe", "--recipe", str(recipe), "--out", str(out)])
    assert res.exit_code == 2 and "empty.yaml: the recipe file is empty" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()  # one sentence, nothing written


def test_a_bad_dataset_a_recipe_file_names_is_said_with_the_file(tmp_path):
    recipe = tmp_path / "my-task.yaml"
    recipe.write_text(f"name: mine\ntask:\n  dataset: {tmp_path / 'nope.jsonl'}\n")
    res = runner.invoke(app, ["probe", "--recipe", str(recipe), "--out", str(tmp_path / "runs")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and text.startswith(f"error: {recipe}: task.dataset '{tmp_path / 'nope.jsonl'}' does not exist")
    # the same key from --set is the command's, not the file's
    res = runner.invoke(app, ["probe", "--recipe", str(recipe), "--set", f"task.dataset={tmp_path / 'other.jsonl'}"])
    assert res.exit_code == 2 and " ".join(res.output.split()).startswith("error: task.dataset")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # a probe of two ranks: about 15 s on 2 cores
def test_two_ranks_evaluate_each_held_out_prompt_once_and_keep_every_answer(tmp_path):
    """Each rank answers its share of the held-out prompts; the main rank keeps everyone's answers, in the held-out
    prompts' order, their mean the evaluation's reward."""
    sets = [*(a for r in ("actor", "rollout", "reward", "ref", "critic") for a in ("--set", f"system.device_map.{r}=[0,1]")),
            "--set", "probe.eval_every=1", "--set", "task.eval_fraction=0.1"]
    res = runner.invoke(app, ["probe", "--steps", "2", "--out", str(tmp_path), *sets])
    assert res.exit_code == 0, res.output
    (run,) = list(tmp_path.iterdir())
    summary, steps = json.loads((run / "summary.json").read_text()), pd.read_parquet(run / "steps.parquet")
    held = [p.text for p in build_workload(load_recipe(str(run / "config.yaml")).task).eval_prompts(64)]
    answers = rundir.read_samples(run, rundir.EVAL_SAMPLES)
    for trained in (0, 1, 2):
        assert answers[answers["trained_steps"] == trained]["prompt"].tolist() == held, trained
    means = answers.groupby("trained_steps")["reward"].mean()
    assert means[0] == pytest.approx(summary["eval/reward_before"])
    assert [means[1], means[2]] == pytest.approx(steps["eval/reward_mean"].tolist())


def test_the_printed_summary_says_a_probe_stopped_short_and_a_projection_from_warm_up_steps(capsys):
    """A probe its timeout ended prints the steps it ran of those planned; a projection read off warm-up steps only
    (which overstate a run's steps) says so."""
    from tunekit.cli import _print_summary

    _print_summary({"status": "timeout", "steps": 5, "steps_planned": 50, "cost/projected_yuan": 0.07,
                    "cost/extrapolated_from_warmup": True}, Path("runs/p"))
    text = " ".join(capsys.readouterr().out.split())
    assert "steps │ 5 of 50" in text and "from warm-up steps only" in text
    _print_summary({"status": "ok", "steps": 50, "steps_planned": 50, "cost/projected_yuan": 0.07}, Path("runs/p"))
    text = " ".join(capsys.readouterr().out.split())
    assert "steps │ 50 │" in text and "of 50" not in text and "warm-up" not in text
