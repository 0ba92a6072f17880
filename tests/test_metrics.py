"""The metric schema: what it holds, and every runner's records held against it (builtin's from a real CPU probe in
``test_cli_probe.py``, TRL's from a real CPU probe in ``test_runner_trl_probe.py``; here the framework runners'
conversions of their frameworks' own logs)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunekit import metrics
from tunekit.config import load_recipe
from tunekit.rundir import StepLog, read_steps
from tunekit.runners.verl_records import step_row

FIXTURE = Path(__file__).parent / "fixtures" / "verl_steps.jsonl"


def test_families_take_only_their_parts():
    assert metrics.find("timing_s/update_actor").name == "timing_s/<phase>"
    assert metrics.find("comm/wait_s/gen").unit == "s"
    assert metrics.find("nvml/mem_used_gb/node1.gpu3").name == "nvml/mem_used_gb/<gpu>"
    assert metrics.find("reward/extra/format").name == "reward/extra/<key>"
    assert metrics.find("perf/mfu/critic").name == "perf/mfu/<role>"
    assert metrics.find("comm/node1/exposed_s/update_actor") is not None
    # a phase no trainer has, a role no recipe trains, a family's member with one part too many
    assert metrics.unknown(["timing_s/testing", "perf/mfu/reward_model", "reward/extra/a/b", "comm/wait_s/"]) == [
        "timing_s/testing", "perf/mfu/reward_model", "reward/extra/a/b", "comm/wait_s/"]
    # the names builtin wrote before it took verl's
    assert metrics.unknown(["actor/clipfrac", "actor/approx_kl", "actor/pg_clipfrac", "actor/ppo_kl"]) == [
        "actor/clipfrac", "actor/approx_kl"]


def test_every_entry_has_a_unit_and_a_meaning_and_one_name():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    assert all(m.unit and len(m.meaning) > 10 for m in metrics.METRICS)
    assert all(metrics.find(n) is not None for n in (metrics.TIMING_STEP, metrics.REWARD_MEAN, metrics.THROUGHPUT,
                                                     metrics.timing("gen"), metrics.comm_wait("adv"),
                                                     metrics.nvml_mem_used(0), metrics.reward_extra("x")))


def test_summary_metrics_are_its_slash_keys_and_steady_medians():
    summary = {"status": "ok", "runner": "builtin", "cost/probe_yuan": 1.0, "steady": {"timing_s/step": 2.0}}
    assert metrics.summary_metrics(summary) == ["cost/probe_yuan", "timing_s/step"]


def test_verls_logged_steps_become_schema_names_only():
    lines = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for line in lines:
        logged = line["data"]
        row = step_row(line["step"], logged, samples_per_step=256)
        assert metrics.unknown(row) == []
        # verl's own names are kept wherever verl and the schema share them
        for name in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy", "actor/grad_norm",
                     "actor/pg_loss", "response_length/mean", "timing_s/gen", "timing_s/update_actor"):
            assert row[name] == pytest.approx(logged[name]), name
        assert row["reward/mean"] == pytest.approx(logged["critic/score/mean"])
        assert row["timing_s/old_logprob"] == pytest.approx(logged["timing_s/old_log_prob"])
    # a PPO step's critic, and sections of verl's that are no phase of the schema
    ppo = step_row(2, {"timing_s/step": 5.0, "timing_s/values": 1.0, "timing_s/update_critic": 2.0,
                       "critic/vf_loss": 0.3, "critic/vf_clipfrac": 0.1, "critic/grad_norm": 4.0,
                       "timing_s/reshard": 0.5, "timing_s/save_checkpoint": 3.0, "critic/vpred_mean": 0.2,
                       "timing_s/dump_rollout_generations": 0.25},
                   samples_per_step=4)
    # verl 0.9's V1 trainer dumps the rollouts after its step timer has closed: the step's time holds none of it
    assert ppo == {"step": 1.0, "timing_s/step": 5.0, "timing_s/values": 1.0,
                   "timing_s/update_critic": 2.0, "critic/vf_loss": 0.3, "critic/vf_clipfrac": 0.1,
                   "critic/grad_norm": 4.0}


def trl_log(step: int) -> dict:
    """One optimizer step's log line as TRL's GRPOTrainer writes it (its own names, with the reward function's)."""
    return {"loss": 0.01 * step, "grad_norm": 1.5, "learning_rate": 1e-5, "num_tokens": 640.0 * (step + 1),
            "completions/mean_length": 4.0 + step, "completions/min_length": 1.0, "completions/max_length": 8.0,
            "completions/clipped_ratio": 0.5, "completions/mean_terminated_length": 3.0,
            "rewards/first_digit/mean": 0.25, "rewards/first_digit/std": 0.1, "reward": 0.25 + 0.1 * step,
            "reward_std": 0.1, "frac_reward_zero_std": 0.5, "kl": 0.002, "entropy": 2.5, "policy_loss": 0.005,
            "clip_ratio/low_mean": 0.0, "clip_ratio/low_min": 0.0, "clip_ratio/high_mean": 0.0,
            "clip_ratio/high_max": 0.0, "clip_ratio/region_mean": 0.03, "epoch": 0.1}


def replay_trl(tmp_path, *, per_step: int, optimizer_steps: int, log_every: int):
    """TRL's callbacks as GRPOTrainer calls them over ``optimizer_steps`` (640 tokens each, generation timed), a log
    line after every ``log_every``-th; the step rows written and the records."""
    pytest.importorskip("trl")
    from tunekit.profiler.startup import StartupClock
    from tunekit.runners.trl_records import PhaseClock, StepRecords

    recipe = load_recipe("tiny-grpo", ["probe.steps=2"])
    clock = PhaseClock(None)
    records = StepRecords(recipe, clock, log=StepLog(tmp_path), per_step=per_step, gpu=False, startup=StartupClock())
    from transformers import TrainerControl

    args, control = SimpleNamespace(world_size=1, eval_steps=None), TrainerControl()
    state = SimpleNamespace(num_input_tokens_seen=0, global_step=0)
    for optimizer_step in range(optimizer_steps):
        records.on_step_begin(args, state, control)
        with clock.phase("generate"):
            state.num_input_tokens_seen += 640
        state.global_step += 1
        records.on_step_end(args, state, control)
        if optimizer_step % log_every == log_every - 1:
            records.on_log(args, state, control, logs=trl_log(optimizer_step))
    records.on_log(args, state, control, logs={"train_runtime": 1.0, "train_loss": 0.1})  # TRL's closing summary
    records.log.flush()
    return read_steps(tmp_path), records


def test_trls_logged_steps_become_schema_names_only(tmp_path):
    steps, records = replay_trl(tmp_path, per_step=2, optimizer_steps=4, log_every=1)  # two probe steps of two
    assert len(steps) == 2 and metrics.unknown(steps.columns) == []
    assert steps["reward/mean"].tolist() == pytest.approx([0.30, 0.50])  # the mean of each step's two logs
    assert steps["actor/pg_clipfrac"].tolist() == pytest.approx([0.03, 0.03])
    # TRL's policy_loss holds the KL term and, under the dapo loss, is divided by the accumulation: not actor/pg_loss
    assert "actor/pg_loss" not in steps and "actor/loss" in steps
    assert steps["perf/total_tokens"].tolist() == [1280.0, 1280.0]
    # TRL measures neither the dual-clip share nor the k1 update KL: nothing is written for them
    assert "actor/pg_clipfrac_lower" not in steps and "actor/ppo_kl" not in steps
    assert metrics.unknown(metrics.summary_metrics(records.result())) == []


def test_trl_logging_once_a_probe_step_gives_one_row_a_step(tmp_path, monkeypatch):
    """A probe logs TRL's metrics once a probe step (``logging_steps`` = its optimizer steps; TRL averages them)."""
    from tunekit.rundir import RUN_DIR_ENV, read_startup

    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    steps, _ = replay_trl(tmp_path, per_step=3, optimizer_steps=6, log_every=3)
    assert read_startup(tmp_path)["first_step/step_s"] == steps["timing_s/step"][0]  # left as the first step ended
    assert steps["reward/mean"].tolist() == pytest.approx([0.45, 0.75])  # each step's one log, as TRL averaged it
    assert steps["perf/total_tokens"].tolist() == [1920.0, 1920.0]


def test_verls_validation_is_the_held_out_reward_outside_the_steps_time():
    logged = {"timing_s/step": 10.0, "timing_s/testing": 2.5, "timing_s/gen": 3.0,
              "val-core/sums/reward/mean@1": 0.5, "val-aux/sums/reward/std@1": 0.1,
              "val-aux/words/reward/mean@1": 0.25, "val-core/words/acc/mean@1": 1.0}
    row = step_row(4, logged, samples_per_step=8)
    # the mean over the two data sources of their reward (core where it is core, aux where acc is), and verl's
    # validation section as the evaluation's time: verl 0.9's V1 trainer validates after its step timer has closed
    assert row["eval/reward_mean"] == pytest.approx(0.375) and row["eval/time_s"] == 2.5
    assert row["timing_s/step"] == 10.0 and metrics.unknown(row) == []
    assert "eval/reward_mean" not in step_row(5, {"timing_s/step": 9.0}, samples_per_step=8)


def test_an_exact_answer_is_a_reward_at_the_top_of_the_tasks_range():
    import torch

    from tunekit.trainer.loop import Trainer

    batch = {"response_mask": torch.ones(4, 3), "attention_mask": torch.ones(4, 5)}
    scores = torch.tensor([10.0, 3.0, 3.0, 1.0])  # a 0-10 reward: one exact answer of four
    for top, exact in ((10, 0.25), (1, 1.0)):
        me = SimpleNamespace(dist=SimpleNamespace(mean=float, world=1),
                             r=load_recipe(None, [f"task.reward_range=[0, {top}]"]))
        assert Trainer.batch_metrics(me, batch, scores)["reward/exact"] == exact
