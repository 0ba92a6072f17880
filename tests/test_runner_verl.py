"""The verl runner: tunekit's knobs as verl's Hydra overrides, what verl cannot express, the workload as verl's
parquet files and reward function, verl's step log as tunekit's rows, and the winner as verl's own command."""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest

from tunekit import metrics
from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError, NotImplementedKnob
from tunekit.runners import RUNNERS, runner_for
from tunekit.runners import verl as verl_runner
from tunekit.runners.verl import VerlRunner, hydra_value, overrides, probe_args
from tunekit.runners.verl_refusals import refusals, trl_conflict
from tunekit.runners.verl_data import VAL_ROWS, main as data_main, write_data
from tunekit.runners.verl_records import MetricsFile, eval_reward, parse_console_line, step_row
from tunekit.runners.verl_reward import PROMPT_KEY, compute_score
from tunekit.workload import build_workload

FIXTURE = Path(__file__).parent / "fixtures" / "verl_steps.jsonl"
VERL = ["runner=verl", "system.controller=single", "system.rollout.backend=vllm"]
GRPO = [*VERL, "algorithm.name=grpo", "system.batch.samples_per_prompt=4"]


def recipe(*sets, name=None):
    return load_recipe(name, [*GRPO, *sets])


def ov(r, steps=20):
    return overrides(r, model="/ckpt", data_dir="/data", steps=steps)


def test_verl_is_a_runner_a_recipe_may_name():
    assert isinstance(runner_for(recipe()), VerlRunner) and RUNNERS["verl"] is VerlRunner


def test_batch_knobs_become_verl_batch_sizes():
    r = recipe("system.batch.prompts_per_step=16", "system.batch.mini_batch_size=32", "system.batch.micro_batch_size=8",
               "algorithm.ppo_epochs=2")
    o = ov(r)
    # verl counts the step batch and the mini-batch in prompts and multiplies by rollout.n
    assert o["data.train_batch_size"] == 16 and o["actor_rollout_ref.rollout.n"] == 4
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 8
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 8
    assert o["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == 8
    assert o["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == 8
    assert o["actor_rollout_ref.actor.ppo_epochs"] == 2


def test_learning_knobs_keep_verl_names():
    r = recipe("algorithm.actor_lr=3e-5", "algorithm.clip_ratio=0.25", "algorithm.clip_ratio_high=0.28",
               "algorithm.clip_ratio_c=4", "algorithm.loss_agg_mode=seq-mean-token-sum-norm", "algorithm.entropy_coef=0.01",
               "algorithm.max_grad_norm=0.5", "algorithm.gamma=0.99", "algorithm.lam=0.9", "task.max_new_tokens=7",
               "task.temperature=0.7", "task.fixed_length=true", "probe.seed=9")
    o = ov(r)
    assert o["algorithm.adv_estimator"] == "grpo" and (o["algorithm.gamma"], o["algorithm.lam"]) == (0.99, 0.9)
    a = "actor_rollout_ref.actor."
    assert (o[a + "optim.lr"], o[a + "clip_ratio_low"], o[a + "clip_ratio_high"], o[a + "clip_ratio_c"]) == (3e-5, 0.25, 0.28, 4.0)
    assert (o[a + "loss_agg_mode"], o[a + "entropy_coeff"], o[a + "optim.clip_grad"]) == ("seq-mean-token-sum-norm", 0.01, 0.5)
    assert o["data.max_response_length"] == 7 and o["data.max_prompt_length"] == 512
    rr = "actor_rollout_ref.rollout."
    assert (o[rr + "temperature"], o[rr + "ignore_eos"], o[rr + "seed"]) == (0.7, True, 9)
    # the engine's context holds a prompt and a response, not the model's whole context (verl's default)
    assert o[rr + "max_model_len"] == 519
    assert ov(recipe())[rr + "ignore_eos"] is False
    # no reference at kl_coef 0: verl then builds none
    assert o[a + "use_kl_loss"] is False and o["algorithm.use_kl_in_reward"] is False and a + "kl_loss_coef" not in o


@pytest.mark.parametrize("sets, expect", [
    (["algorithm.kl_coef=0.04"], {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.04,
                                  "actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.use_kl_in_reward": False}),
    (["algorithm.kl_coef=0.04", "algorithm.kl_estimator=abs"], {"actor_rollout_ref.actor.kl_loss_type": "abs"}),
    (["algorithm.kl_coef=0.02", "algorithm.kl_loss=false"],
     {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.type": "fixed",
      "algorithm.kl_ctrl.kl_coef": 0.02, "actor_rollout_ref.actor.use_kl_loss": False}),
    (["algorithm.kl_coef=0.02", "algorithm.kl_loss=false", "algorithm.kl_estimator=mse"], {"algorithm.kl_penalty": "mse"}),
])
def test_kl_goes_to_the_loss_or_the_reward(sets, expect):
    o = ov(recipe(*sets))
    assert {k: o[k] for k in expect} == expect


def test_ppo_adds_the_critic_with_its_own_knobs():
    r = load_recipe(None, [*VERL, "algorithm.critic_lr=2e-5", "algorithm.value_clip=0.3", "system.batch.micro_batch_size=4",
                           "system.memory.gradient_checkpointing=true", "system.memory.param_offload=true"])
    o = ov(r)
    assert o["algorithm.adv_estimator"] == "gae" and o["critic.model.path"] == "/ckpt"
    assert (o["critic.optim.lr"], o["critic.cliprange_value"], o["critic.ppo_micro_batch_size_per_gpu"]) == (2e-5, 0.3, 4)
    assert o["critic.model.enable_gradient_checkpointing"] is True and o["critic.fsdp.param_offload"] is True
    assert not any(k.startswith("critic.") for k in ov(recipe()))  # grpo: no critic


def test_a_ppo_recipe_with_every_optional_knob_fills_each_part_of_verls_config(monkeypatch):
    """The whole override set, part by part of verl's config: a key lost or renamed shows here."""
    monkeypatch.setattr(verl_runner, "has_flash_attn", lambda: False)
    r = load_recipe(None, [*VERL, "algorithm.kl_coef=0.02", "algorithm.kl_loss=false", "model.trust_remote_code=true",
                           "system.compile=false", "system.rollout.max_num_seqs=64", "system.rollout.max_num_batched_tokens=4096",
                           "system.rollout.enable_prefix_caching=true", "system.rollout.enable_chunked_prefill=true"])
    parts = {
        "algorithm.": "adv_estimator gamma lam use_kl_in_reward kl_penalty kl_ctrl.type kl_ctrl.kl_coef",
        "data.": "train_files val_files train_batch_size shuffle max_prompt_length max_response_length trust_remote_code",
        "actor_rollout_ref.model.": "path custom_chat_template enable_gradient_checkpointing trust_remote_code "
                                    "use_remove_padding",
        "+actor_rollout_ref.model.": "override_config.attn_implementation",
        "actor_rollout_ref.actor.": "optim.lr optim.clip_grad ppo_epochs ppo_mini_batch_size ppo_micro_batch_size_per_gpu "
                                    "clip_ratio_low clip_ratio_high clip_ratio_c loss_agg_mode entropy_coeff "
                                    "fsdp_config.param_offload fsdp_config.optimizer_offload "
                                    "fsdp_config.reshard_after_forward fsdp_config.use_torch_compile use_kl_loss",
        "actor_rollout_ref.rollout.": "name n tensor_model_parallel_size gpu_memory_utilization free_cache_engine "
                                      "enforce_eager temperature ignore_eos seed max_model_len "
                                      "log_prob_micro_batch_size_per_gpu max_num_seqs max_num_batched_tokens "
                                      "enable_prefix_caching enable_chunked_prefill",
        "actor_rollout_ref.ref.": "log_prob_micro_batch_size_per_gpu fsdp_config.param_offload",
        "critic.": "model.path model.enable_gradient_checkpointing model.trust_remote_code model.use_remove_padding "
                   "optim.lr optim.clip_grad cliprange_value ppo_micro_batch_size_per_gpu fsdp.param_offload "
                   "fsdp.optimizer_offload fsdp.reshard_after_forward",
        "+critic.": "model.override_config.attn_implementation",
        "reward.": "custom_reward_function.path custom_reward_function.name",
        "+reward.": "custom_reward_function.reward_kwargs.tunekit_reward",
        "trainer.": "n_gpus_per_node nnodes total_training_steps save_freq test_freq val_before_train logger "
                    "project_name experiment_name",
    }
    expect = {prefix + key for prefix, keys in parts.items() for key in keys.split()}
    got = set(ov(r))
    assert (sorted(expect - got), sorted(got - expect)) == ([], [])


def test_memory_compile_and_rollout_knobs():
    r = recipe("system.memory.param_offload=true", "system.memory.reshard_after_forward=false",
               "system.memory.gradient_checkpointing=true", "system.compile=false", "system.rollout.gpu_memory_utilization=0.3",
               "system.rollout.enable_sleep=false", "system.rollout.enforce_eager=false", "system.rollout.torch_compile=true",
               "system.rollout.max_num_seqs=64", "system.rollout.max_num_batched_tokens=4096",
               "system.rollout.enable_prefix_caching=false", "system.rollout.enable_chunked_prefill=true")
    o, a, rr = ov(r), "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    assert o[a + "fsdp_config.param_offload"] is True and o[a + "fsdp_config.optimizer_offload"] is True
    assert o["actor_rollout_ref.ref.fsdp_config.param_offload"] is True
    assert o[a + "fsdp_config.reshard_after_forward"] is False and o[a + "fsdp_config.use_torch_compile"] is False
    # auto: verl's own default; verl 0.9 reads no actor.use_torch_compile, and its engine never compiles the model
    assert not any(k.endswith("use_torch_compile") for k in ov(recipe()))
    runner = VerlRunner()
    assert runner.training_path(recipe(), gpu=True) == {"resolved/fsdp": True, "resolved/compile": False,
                                                         "resolved/master_weights": False,
                                                         "resolved/cuda_graphs": False,
                                                         "resolved/old_logprob": True}
    assert runner.training_path(recipe("system.compile=false"), gpu=True)["resolved/compile"] is False
    assert o["actor_rollout_ref.model.enable_gradient_checkpointing"] is True
    assert (o[rr + "name"], o[rr + "tensor_model_parallel_size"], o[rr + "gpu_memory_utilization"]) == ("vllm", 1, 0.3)
    assert o[rr + "free_cache_engine"] is False and o[rr + "enforce_eager"] is False
    assert (o[rr + "max_num_seqs"], o[rr + "max_num_batched_tokens"]) == (64, 4096)
    assert o[rr + "enable_prefix_caching"] is False and o[rr + "enable_chunked_prefill"] is True
    d = ov(recipe())  # unset engine knobs keep verl's own values
    assert not any(k in d for k in (rr + "max_num_seqs", rr + "enable_prefix_caching", rr + "calculate_log_probs"))
    assert d[rr + "enforce_eager"] is True
    assert ov(recipe("system.rollout.logprobs=true"))[rr + "calculate_log_probs"] is True
    assert ov(recipe("system.rollout.logprobs=false"))[rr + "calculate_log_probs"] is False


def test_devices_steps_and_the_probe_run_settings():
    two = recipe("system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}")
    o = ov(two, steps=7)
    assert (o["trainer.n_gpus_per_node"], o["trainer.nnodes"], o["trainer.total_training_steps"]) == (2, 1, 7)
    assert (o["trainer.save_freq"], o["trainer.test_freq"], o["trainer.val_before_train"]) == (-1, -1, False)
    assert o["trainer.logger"] == ["console", "file"] and o["data.shuffle"] is False
    assert o["data.train_files"] == "/data/train.parquet" and o["actor_rollout_ref.model.path"] == "/ckpt"
    assert o["+reward.custom_reward_function.reward_kwargs.tunekit_reward"] == "tunekit.workload.arithmetic:reward"
    assert Path(o["reward.custom_reward_function.path"]).name == "verl_reward.py"
    assert VerlRunner().env(two, None, on_gpu=False)["HF_HUB_OFFLINE"] == "1"


def test_a_probe_starts_verl_without_what_a_step_does_not_need(tmp_path):
    """A probe's overrides keep verl's start short without changing a step: no resume search, no dataloader
    processes, no Ray dashboard, no validation or saving, and an engine with CUDA graphs captures only the decode
    batches it can run."""
    args = dict(a.split("=", 1) for a in verl_runner.probe_args(recipe("system.batch.prompts_per_step=8"),
                                                                 model=tmp_path, data_dir=tmp_path))
    assert (args["trainer.resume_mode"], args["data.dataloader_num_workers"]) == ("disable", "0")
    assert args["+ray_kwargs.ray_init.include_dashboard"] == "false"  # handed to ray.init as it is
    assert (args["trainer.val_before_train"], args["trainer.test_freq"], args["trainer.save_freq"]) == ("false", "-1", "-1")
    rr = "actor_rollout_ref.rollout."
    assert rr + "cudagraph_capture_sizes" not in args  # eager (the default): nothing captured
    graphs = ov(recipe("system.rollout.enforce_eager=false", "system.batch.prompts_per_step=10",
                       "system.batch.micro_batch_size=8", "system.batch.samples_per_prompt=4"))
    assert graphs[rr + "enforce_eager"] is False
    assert graphs[rr + "cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 24, 32, 40]  # 40 samples a step
    # 512 samples a step, no max_num_seqs: verl's engine decodes at most its default 256 at once
    wide = ov(recipe("system.rollout.enforce_eager=false", "system.batch.prompts_per_step=128"))
    assert wide[rr + "cudagraph_capture_sizes"][-1] == 256
    bounded = ov(recipe("system.rollout.enforce_eager=false", "system.rollout.max_num_seqs=20"))
    assert bounded[rr + "cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 20]


def test_without_flash_attn_models_load_with_sdpa_and_padding(monkeypatch):
    monkeypatch.setattr(verl_runner, "has_flash_attn", lambda: False)
    o = ov(load_recipe(None, VERL))
    for m in ("actor_rollout_ref", "critic"):
        assert o[f"+{m}.model.override_config.attn_implementation"] == "sdpa" and o[f"{m}.model.use_remove_padding"] is False
    monkeypatch.setattr(verl_runner, "has_flash_attn", lambda: True)
    assert not any("attn_implementation" in k or "use_remove_padding" in k for k in ov(load_recipe(None, VERL)))


@pytest.mark.parametrize("sets, key", [
    (["system.controller=spmd"], "system.controller=spmd"),
    (["system.rollout.backend=hf"], "system.rollout.backend=hf"),
    (["system.rollout.backend=vllm_server"], "system.rollout.backend=vllm_server"),
    (["system.device_map.rollout=[1]"], "system.device_map"),
    (["system.weight_sync=collective"], "system.weight_sync=collective"),
    (["system.ray_address=10.0.0.1:6379"], "system.ray_address"),
    (["model.reward_model_path=/rm"], "model.reward_model_path"),
    (["model.dtype=float32"], "model.dtype=float32"),
    (["algorithm.name=ppo", "algorithm.whiten_advantages=false"], "algorithm.whiten_advantages=false"),
    (["system.rollout.sleep_level=1"], "system.rollout.sleep_level=1"),
    (["system.rollout.enforce_eager=false"], "system.rollout.torch_compile=false"),
    (["system.memory.fsdp_single_gpu=false"], "system.memory.fsdp_single_gpu=false"),
    (["system.compile=true"], "system.compile=true"),
    (["profiler.trace=true"], "profiler.trace"),
    (["system.batch.prompts_per_step=6", "system.batch.mini_batch_size=6", "system.batch.micro_batch_size=6"],
     "system.batch.mini_batch_size 6"),
    (["system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}",
      "system.batch.micro_batch_size=128"], "system.batch.micro_batch_size 128"),
])
def test_what_verl_cannot_express_is_refused_by_name(sets, key):
    problems = refusals(recipe(*sets), gpu=True)
    assert len(problems) == 1 and problems[0].startswith(key), problems
    with pytest.raises(NotImplementedKnob, match=key.split("=")[0]):
        VerlRunner().check(recipe(*sets), cuda_count=2)


def test_a_fault_asked_of_the_probe_is_refused(monkeypatch):
    monkeypatch.setenv("TUNEKIT_FAULT", "crash")
    assert [p.split(":")[0] for p in refusals(recipe(), gpu=True)] == ["TUNEKIT_FAULT=crash"]


def test_several_refusals_come_in_a_fixed_order_and_check_names_the_first(monkeypatch):
    monkeypatch.setenv("TUNEKIT_FAULT", "crash")
    r = load_recipe(None, [*VERL, "algorithm.name=ppo", "algorithm.whiten_advantages=false", "system.controller=spmd",
                           "system.rollout.backend=hf", "system.weight_sync=collective", "model.dtype=float32",
                           "system.rollout.sleep_level=1", "profiler.trace=true", "system.batch.micro_batch_size=128",
                           "system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}"])
    assert [p.split(":")[0] for p in refusals(r, gpu=False)] == [
        "system.device", "system.controller=spmd", "system.rollout.backend=hf", "system.weight_sync=collective",
        "model.dtype=float32", "algorithm.whiten_advantages=false", "system.rollout.sleep_level=1", "profiler.trace",
        "TUNEKIT_FAULT=crash", "system.batch.micro_batch_size 128"]
    with pytest.raises(NotImplementedKnob, match="^system.controller=spmd"):  # with GPUs, system.device passes
        VerlRunner().check(r, cuda_count=2)


def test_on_cpu_verl_is_refused_and_the_default_grpo_recipe_runs_on_gpu():
    assert refusals(recipe(), gpu=True) == []
    assert [p.split(":")[0] for p in refusals(recipe(), gpu=False)] == ["system.device"]


@pytest.mark.parametrize("value, text", [
    (True, "true"), (None, "null"), (1e-06, "1e-06"), (3, "3"), (["console", "file"], "[console,file]"),
    ("/a/b-c.parquet", "/a/b-c.parquet"), ("pkg.mod:fn", '"pkg.mod:fn"'), ("1.5", '"1.5"'), ("true", '"true"'),
    ('{{ m["x"] }}', '"{{ m[\\"x\\"] }}"'), ("/my dir", '"/my dir"'),
])
def test_values_are_written_in_hydras_grammar(value, text):
    assert hydra_value(value) == text


def test_handback_is_verls_command_with_the_data_written_first():
    r = recipe("system.batch.prompts_per_step=16", "algorithm.kl_coef=0.01", "model.preset=qwen2.5-0.5b")
    hb = VerlRunner().handback(r, steps=500)
    steps, data, train = hb.command.split(" && ")
    assert steps == "STEPS=500"  # one variable sets the run's length for both commands
    assert shlex.split(data) == ["python", "-m", "tunekit.runners.verl_data", "best-recipe.yaml", "verl-data", "--steps", "$STEPS"]
    words = shlex.split(train.replace("$STEPS", "500"))
    assert words[:4] == ["CUDA_VISIBLE_DEVICES=0", "python", "-m", "verl.trainer.main_ppo"]
    args = dict(w.split("=", 1) for w in words[4:])
    assert args["trainer.total_training_steps"] == "500" and args["data.train_batch_size"] == "16"
    assert args["data.train_files"] == "$PWD/verl-data/train.parquet"  # the shell makes it absolute
    assert args["trainer.save_freq"] == "500"  # the probes save nothing; the run keeps its last step
    assert args["actor_rollout_ref.actor.kl_loss_coef"] == "0.01"
    assert args["actor_rollout_ref.model.path"] == '"<your qwen2.5-0.5b checkpoint directory>"'
    assert "trainer.resume_mode" not in args  # the user's run keeps verl's resume behaviour
    assert "data.dataloader_num_workers" not in args
    assert "+ray_kwargs.ray_init.include_dashboard" not in args  # nor its Ray dashboard
    assert "steps: 500" in hb.files["best-recipe.yaml"] and "runner: verl" in hb.files["best-recipe.yaml"]
    assert args["trainer.test_freq"] == "-1"  # no evaluation where the probes ran none
    evaluated = VerlRunner().handback(recipe("probe.eval_every=5", "task.eval_fraction=0.1"), steps=500)
    args = dict(w.split("=", 1) for w in shlex.split(evaluated.command.split(" && ")[2].replace("$STEPS", "500"))[4:])
    assert args["trainer.test_freq"] == "5" and args["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "false"
    assert args["trainer.val_before_train"] == "true" and "trainer.validation_data_dir" not in args


def test_the_workload_round_trips_through_verls_parquet_files(tmp_path):
    r = recipe("system.batch.prompts_per_step=3", "probe.steps=2", "probe.seed=5")
    train, val = write_data(r, tmp_path, steps=2)
    rows = pd.read_parquet(train)
    expected = build_workload(r.task).probe_prompts(3, 2, 5)
    assert len(rows) == 6 and len(pd.read_parquet(val)) == VAL_ROWS
    assert [list(p) for p in rows["prompt"]] == [[{"role": "user", "content": p.text}] for p in expected]
    assert [rm["ground_truth"] for rm in rows["reward_model"]] == [p.answer for p in expected]
    assert [e[PROMPT_KEY] for e in rows["extra_info"]] == [p.text for p in expected]
    assert set(rows["data_source"]) == {"arithmetic"}


def test_verl_validates_greedily_on_the_held_out_prompts(tmp_path):
    r = recipe("system.batch.prompts_per_step=3", "probe.steps=2", "probe.eval_every=2", "task.eval_fraction=0.1",
               "probe.eval_prompts=5")
    train, val = write_data(r, tmp_path, steps=2)
    held = [e[PROMPT_KEY] for e in pd.read_parquet(val)["extra_info"]]
    assert held == [p.text for p in build_workload(r.task).eval_prompts(5)] and len(held) == 5
    assert not set(held) & {e[PROMPT_KEY] for e in pd.read_parquet(train)["extra_info"]}
    args = probe_args(r, model=tmp_path, data_dir=tmp_path, validations=tmp_path / "v")
    assert "trainer.test_freq=2" in args and "actor_rollout_ref.rollout.val_kwargs.do_sample=false" in args
    assert "actor_rollout_ref.rollout.val_kwargs.temperature=0" in args
    # once before training too, unless the probe says not; each validation's responses dumped for eval_samples
    assert "trainer.val_before_train=true" in args and f"trainer.validation_data_dir={tmp_path / 'v'}" in args
    later = r.model_copy(update={"probe": r.probe.model_copy(update={"eval_before_train": False})})
    assert "trainer.val_before_train=false" in probe_args(later, model=tmp_path, data_dir=tmp_path)
    assert "trainer.test_freq=-1" in probe_args(recipe("probe.steps=2"), model=tmp_path, data_dir=tmp_path)


def test_verls_validations_before_and_during_training_are_read_with_their_answers(tmp_path, monkeypatch):
    """verl logs the validation before training as its step 0 (no step time) after printing "Initial validation
    metrics", and dumps each validation's responses to <steps trained>.jsonl in a background thread."""
    import json
    import time

    from tunekit.profiler.startup import StartupClock
    from tunekit.rundir import EVAL_SAMPLES, RUN_DIR_ENV, EvalSampleLog, StepLog, read_samples, read_steps
    from tunekit.runners.verl_entry import Records
    from tunekit.runners.verl_startup import SPAWNED

    def dump(name, rows):
        path = validations / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    validations = tmp_path / "validations"
    validations.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    steps = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    steps[1]["data"]["val-core/arithmetic/reward/mean@1"] = 0.75  # validated after the second step
    before = {"step": 0, "data": {"val-core/arithmetic/reward/mean@1": 0.25, "val-aux/arithmetic/acc/mean@1": 0.0}}
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [before, *steps]))
    r = recipe("system.batch.prompts_per_step=64", "probe.eval_every=2", "task.eval_fraction=0.1")
    records = Records(r, StepLog(run), MetricsFile(tmp_path / "m.jsonl"), validations=validations,
                      eval_samples=EvalSampleLog(run), startup=StartupClock(time.time() - 300))
    spawned = records.startup.started + 5.0
    records.lines.mark(SPAWNED, spawned)
    records.lines.see("all initialize finished, ready to fit", spawned + 100.0)
    records.lines.see("(TaskRunner pid=1) Initial validation metrics: {'val-core/arithmetic/reward/mean@1': 0.25}",
                      spawned + 104.0)
    answer = {"input": "user\n2+2=", "output": "4", "gts": "4", "score": 1.0, "step": 0}
    records.dumped.add(dump("0.jsonl", [answer, answer | {"input": "user\n3+3=", "output": "7", "gts": "6", "score": 0.0}]))
    dump("2.jsonl", [answer | {"step": 2}] * 2)  # whole, but verl has not said so yet
    monkeypatch.setenv(RUN_DIR_ENV, str(run))
    records.poll()
    assert read_samples(run, EVAL_SAMPLES)["trained_steps"].tolist() == [0, 0]  # only what verl said is whole
    (validations / "3.jsonl").write_text('{"input": "cut sh')  # verl stopped while writing it
    records.finish()
    records.log.flush()
    kept = read_samples(run, EVAL_SAMPLES)
    assert kept["trained_steps"].tolist() == [0, 0, 2, 2] and kept["reward"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert kept["response"].tolist()[:2] == ["4", "7"] and kept["answer"].tolist()[:2] == ["4", "6"]
    assert not list(validations.iterdir())  # every dump read once and removed, the cut one dropped
    result = records.result()
    # the untrained model's held-out reward, its seconds a part of the start-up apart from what follows it
    assert result["eval/reward_before"] == 0.25 and result["startup/eval_before_s"] == pytest.approx(4.0)
    assert result["startup/before_first_step_s"] == pytest.approx(records.startup.first_ready - (spawned + 104.0))
    held_out = read_steps(run)["eval/reward_mean"]  # the validation after the second step, in its row
    assert held_out.notna().tolist() == [False, True, False] and held_out[1] == 0.75


def test_the_data_command_writes_a_full_runs_files(tmp_path):
    path = tmp_path / "best-recipe.yaml"
    from tunekit.config import dump_recipe

    path.write_text(dump_recipe(recipe("system.batch.prompts_per_step=4")))
    assert data_main([str(path), str(tmp_path / "d"), "--steps", "3"]) == 0
    assert len(pd.read_parquet(tmp_path / "d" / "train.parquet")) == 12


def test_the_handed_back_run_of_the_embedded_model_loads_the_copy_the_probes_loaded(tmp_path, monkeypatch):
    """The embedded tokenizer drops a newline, which verl's rollout needs as one token for a qwen2 model: the
    probes load a copy with it added (prepare_model), so the full run's data step writes that copy and every model
    path of its command points at it."""
    from transformers import AutoTokenizer

    from tunekit.config import dump_recipe

    r = recipe("system.batch.prompts_per_step=4")
    hb = VerlRunner().handback(r, steps=3)
    _, data, train = hb.command.split(" && ")
    assert shlex.split(data)[-3:] == ["--model", "--steps", "$STEPS"]
    paths = [w for w in train.split() if ".model.path=" in w]
    assert paths and all(w.endswith('="$PWD"/verl-data/model') for w in paths)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "best-recipe.yaml").write_text(hb.files["best-recipe.yaml"])
    assert data_main(shlex.split(data.replace("$STEPS", "3"))[3:]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "verl-data" / "model")
    assert len(tok.encode("\n", add_special_tokens=False)) == 1 and tok.chat_template
    # a model whose tokenizer needs nothing is loaded where it is, with no copy
    from tunekit.runners.model_dir import needs_own_copy
    assert needs_own_copy(r) and not needs_own_copy(recipe("model.preset=qwen2.5-0.5b"))


def test_the_reward_adapter_scores_the_arithmetic_task_as_tunekit_does(tmp_path):
    r = recipe("probe.steps=1")
    train, _ = write_data(r, tmp_path, steps=1)
    row = pd.read_parquet(train).iloc[0]
    truth, extra = row["reward_model"]["ground_truth"], dict(row["extra_info"])
    call = dict(data_source=row["data_source"], ground_truth=truth, extra_info=extra)
    assert compute_score(solution_str=truth, **call) == 1.0
    assert compute_score(solution_str="", **call) == 0.0
    wrong = "9" * len(truth) if truth[0] != "9" else "1" * len(truth)
    assert compute_score(solution_str=wrong, **call) < 1.0


def test_the_reward_adapter_calls_a_users_function_in_either_spelling(tmp_path, monkeypatch):
    (tmp_path / "verl_user_rewards.py").write_text(
        "def plain(prompt, response, answer):\n    return float(prompt.startswith('Q') and response == answer)\n"
        "def verlish(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 0.5 if data_source == 'mydata' else 0.0, 'extra': 1}\n"
        "def keys(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sorted(extra_info) == ['difficulty', 'index'])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = {PROMPT_KEY: "Q: 2+2", "index": 0}
    try:
        assert compute_score("mydata", "4", "4", extra, tunekit_reward="verl_user_rewards:plain") == 1.0
        assert compute_score("mydata", "4", "4", extra, tunekit_reward="verl_user_rewards:verlish") == {"score": 0.5, "extra": 1.0}
        # the keys verl's reward loop adds to every row do not reach the user's function
        seen = {**extra, "num_turns": 2, "rollout_reward_scores": {}, "difficulty": 3}
        assert compute_score("mydata", "4", "4", seen, tunekit_reward="verl_user_rewards:keys") == 1.0
    finally:
        sys.modules.pop("verl_user_rewards", None)


def test_verls_step_log_becomes_tunekits_rows(tmp_path):
    # the fixture is the first three steps verl 0.9.1 logged in a GPU probe (Qwen2.5-0.5B preset, GRPO, one H200)
    path = tmp_path / "m.jsonl"
    text = FIXTURE.read_bytes()
    cut = text.index(b"\n") + 40
    path.write_bytes(text[:cut])  # a line and a half: the half waits
    reader = MetricsFile(path)
    first = reader.read()
    assert [s for s, _ in first] == [1]
    path.write_bytes(text)
    rest = reader.read()
    assert [s for s, _ in rest] == [2, 3]
    row = step_row(*rest[0], samples_per_step=256)
    assert row["step"] == 1.0  # verl counts from 1
    assert row["timing_s/step"] == pytest.approx(13.6742, rel=1e-4) and row["timing_s/gen"] == pytest.approx(2.05998, rel=1e-4)
    assert row["timing_s/old_logprob"] == pytest.approx(3.37323, rel=1e-4) and row["timing_s/update_actor"] == pytest.approx(7.79826, rel=1e-4)
    assert row["timing_s/update_weights"] == pytest.approx(0.18272, rel=1e-4) and row["timing_s/adv"] == pytest.approx(0.13450, rel=1e-4)
    assert row["reward/mean"] == pytest.approx(0.00160687, rel=1e-4) and row["perf/total_tokens"] == 34092
    assert row["perf/max_memory_allocated_gb"] == pytest.approx(12.7737, rel=1e-4) and row["perf/max_memory_reserved_gb"] == pytest.approx(14.2715, rel=1e-4)
    assert row["response_length/mean"] == 128.0 and row["actor/entropy"] == pytest.approx(11.7518, rel=1e-4)
    assert row["rollout/tokens_per_s"] == pytest.approx(128 * 256 / 2.05998, rel=1e-4)
    # verl's own derived figures are not carried: tunekit derives throughput and MFU from the row
    assert not any(k in row for k in ("perf/throughput", "perf/mfu/actor", "timing_per_token_ms/gen", "critic/score/max",
                                      "rollout_corr/kl"))


def test_the_reference_phase_and_kl_keep_their_meaning():
    row = step_row(4, {"timing_s/step": 9.0, "timing_s/ref": 1.25, "actor/kl_loss": 0.001, "critic/perf/max_memory_reserved_gb": 40.0,
                       "actor/perf/max_memory_reserved_gb": 32.0, "timing_s/testing": 5.0}, samples_per_step=4)
    # verl's V1 trainer validates after its step timer has closed: the probe's evaluation, outside the step's time
    assert row == {"step": 3.0, "timing_s/step": 9.0, "timing_s/ref": 1.25, "actor/ref_kl": 0.001,
                   "perf/max_memory_reserved_gb": 40.0, "eval/time_s": 5.0}
    # a data source may hold a slash (openai/gsm8k): its validation reward is read all the same
    assert eval_reward({"val-core/openai/gsm8k/reward/mean@1": 0.5, "val-aux/openai/gsm8k/reward/mean@1": 0.1}) == 0.5


def test_lines_that_are_no_training_step_are_skipped():
    assert step_row(0, {"val-core/arithmetic/acc/mean@1": 0.1}, samples_per_step=4) is None


def test_console_lines_parse_as_the_file_logger_does():
    # the console lines verl printed for the same three steps as the file logger's fixture (Ray's colour codes kept)
    console = (Path(__file__).parent / "fixtures" / "verl_console.txt").read_text().splitlines()
    for line, (step, metrics) in zip(console, MetricsFile(FIXTURE).read(), strict=True):
        parsed = parse_console_line(line)
        assert parsed is not None and parsed[0] == step
        assert step_row(*parsed, samples_per_step=256) == step_row(step, metrics, samples_per_step=256)
    assert parse_console_line("Training Progress: 10%") is None


def test_a_probes_records_take_each_step_once_from_either_logger(tmp_path, monkeypatch):
    from tunekit.rundir import RUN_DIR_ENV, StepLog, read_startup, read_steps
    from tunekit.runners.verl_entry import Records

    lines = MetricsFile(FIXTURE).read()
    path = tmp_path / "m.jsonl"
    import time

    from tunekit.profiler.startup import StartupClock

    records = Records(recipe("system.batch.prompts_per_step=64"), StepLog(tmp_path), MetricsFile(path),
                      startup=StartupClock(time.time() - 300))  # the probe's process began five minutes ago
    from tunekit.runners.verl_startup import SPAWNED

    spawned = records.startup.started + 5.0
    records.lines.mark(SPAWNED, spawned)
    records.lines.see("ray init kwargs: {'num_cpus': None}", spawned + 6.0)
    records.lines.see("Started a local Ray instance.", spawned + 9.0)
    records.console.put(lines[0])  # the console gave step 1 before the file was written
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    records.poll()
    # the first step's line leaves the start-up so far in the run directory, verl's parts in it
    started = read_startup(tmp_path)
    assert started["first_step/step_s"] == pytest.approx(43.0187, abs=1e-4)
    assert started["startup/ray_start_s"] == pytest.approx(3.0) and started["startup_s"] >= 0
    path.write_bytes(FIXTURE.read_bytes())  # then the file gives steps 1-3, and the console step 3 again
    records.console.put(lines[2])
    records.poll()
    records.log.flush()
    steps = read_steps(tmp_path)
    assert steps["step"].tolist() == [0.0, 1.0, 2.0] and steps["timing_s/step"].tolist() == pytest.approx([43.0187, 13.6742, 13.7095], abs=1e-4)
    result = records.result()
    assert result["runner/version"] and result["steady"]["timing_s/step"] > 0 and result["startup_s"] >= 0
    # verl's start-up parts, read off its lines, beside the clock's own; the parts and the rest add up to the start-up
    assert (result["startup/imports_s"], result["startup/ray_start_s"]) == pytest.approx((6.0, 3.0))
    assert "startup/engine_start_s" not in result  # its lines never came: no part, its time stays in the rest
    parts = sum(v for k, v in result.items() if k.startswith("startup/") and k != "startup/other_s")
    assert parts + result["startup/other_s"] == pytest.approx(result["startup_s"])
    assert metrics.unknown(metrics.summary_metrics(result)) == []


@pytest.mark.parametrize("sets", [
    [],  # grpo, no reference
    ["algorithm.kl_coef=0.01", "system.rollout.max_num_seqs=64", "model.trust_remote_code=true",
     "system.rollout.enforce_eager=false"],
    ["algorithm.name=ppo", "algorithm.kl_coef=0.01", "algorithm.kl_loss=false", "system.memory.param_offload=true"],
])
def test_every_override_names_a_key_of_verls_own_config(tmp_path, sets):
    """With verl installed: verl's ppo_trainer config, composed with the overrides, holds each value at its key
    (Hydra refuses a key the config lacks unless it is written with +)."""
    import importlib.util

    pytest.importorskip("hydra")
    spec = importlib.util.find_spec("verl")
    if spec is None:
        pytest.skip("verl is not installed (pip install -e '.[verl]')")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    values = overrides(recipe(*sets), model=str(tmp_path / "my model"), data_dir=str(tmp_path), steps=5)
    config_dir = Path(spec.origin).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose("ppo_trainer", overrides=verl_runner.hydra_args(values))
    for key, value in values.items():
        got = OmegaConf.select(cfg, key.lstrip("+"), throw_on_missing=True)
        assert (OmegaConf.to_object(got) if OmegaConf.is_config(got) else got) == value, key


def test_a_line_verls_console_logger_printed_parses():
    # printed by verl 0.9.1's Tracking(default_backend=["console", "file"]).log(..., step=1)
    line = ("step:1 - timing_s/step:np.float64(1.5) - timing_s/gen:0.5 - critic/score/mean:np.float32(0.25) - "
            "perf/total_num_tokens:100 - actor/perf/max_memory_allocated_gb:2.0 - response_length/mean:4.0")
    step, metrics = parse_console_line(line)
    row = step_row(step, metrics, samples_per_step=8)
    assert row == {"step": 0.0, "timing_s/step": 1.5, "timing_s/gen": 0.5, "reward/mean": 0.25, "perf/total_tokens": 100.0,
                   "response_length/mean": 4.0, "perf/max_memory_allocated_gb": 2.0, "rollout/tokens_per_s": 64.0}


FAKE_VERL = '''
import json, os, sys, time
print("ray init kwargs: {{'num_cpus': None}}")  # verl's run_ppo, then Ray's line once its cluster is up
time.sleep(0.05)
print("2026-12-01 04:35:31,500\tINFO worker.py:2027 -- Started a local Ray instance.", file=sys.stderr)
lines = open({fixture!r}).read().splitlines()
dump = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.rollout_data_dir=")), None)
def dump_rollouts(step, say=True):  # verl writes them in a background thread, then says so
    os.makedirs(dump, exist_ok=True)
    path = os.path.join(dump, f"{{step}}.jsonl")
    with open(path, "w") as g:
        for i in range(16):
            g.write(json.dumps({{"input": f"user\\n{{i}}+{{step}}=", "output": f"{{i + step}}", "gts": f"{{i + step}}",
                                "score": float(i % 2), "step": step}}) + "\\n")
    if say:
        print(f"Dumped generations to {{path}}", flush=True)
with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
    for line in lines[:{steps}]:
        step = json.loads(line)["step"]
        if step == 1:  # the dump whole before the metrics line
            dump_rollouts(step)
        f.write(line + "\\n")
        f.flush()
        if step == 2:  # the metrics line first, the dump a poll later
            time.sleep(1.2)
            dump_rollouts(step)
        if step == 3:  # a dump whose line never came before verl ended
            dump_rollouts(step, say=False)
print("step:9 - timing_s/step:1.0")  # a console line for a step the file has not given
print({message!r})
sys.exit({code})
'''


@pytest.mark.parametrize("code, steps, message, status", [
    (0, 3, "done", None), (1, 1, "torch.OutOfMemoryError: CUDA out of memory", "oom"), (1, 0, "boom", "failed"),
])
def test_the_probe_process_runs_verl_and_records_its_steps(tmp_path, monkeypatch, code, steps, message, status):
    """The probe's first process, with a stand-in for verl's entry point that logs as verl does."""
    import json

    from tunekit import rundir
    from tunekit.runners import verl_entry

    (tmp_path / "fake_main_ppo.py").write_text(FAKE_VERL.format(fixture=str(FIXTURE), steps=steps, message=message, code=code))
    monkeypatch.setattr(verl_runner, "ENTRY", "fake_main_ppo")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_config(run, recipe("probe.steps=3", "system.batch.prompts_per_step=8"))
    monkeypatch.chdir(tmp_path)  # the run directory given relative, as `tunekit probe` gives its default runs/...
    rc = verl_entry.main("run")
    rows = rundir.read_steps(run)
    assert (run / "verl-steps.jsonl").exists() and not (run / "verl").exists()
    if status is None:
        assert rc == 0 and rows["step"].tolist() == [0.0, 1.0, 2.0, 8.0] and metrics.unknown(rows.columns) == []
        result = rundir.read_result(run)
        assert result["runner/version"] and not rundir.read_errors(run)
        # tunekit's preparation timed, verl's lines relayed and read as they came (no buffering in the pipe)
        assert result["startup/prepare_s"] > 0 and result["startup/ray_start_s"] >= 0.04
        assert result["startup/imports_s"] > 0
        # what the model said, from verl's dump of each step's rollouts: four of the sixteen, spread over the batch
        samples = rundir.read_samples(run)
        assert samples["step"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
        last = samples[samples["step"] == 2]
        assert last["prompt"].tolist() == [f"user\n{i}+3=" for i in (0, 4, 8, 12)]
        assert last["response"].tolist() == last["answer"].tolist() == [str(i + 3) for i in (0, 4, 8, 12)]
        assert last["reward"].tolist() == [0.0, 0.0, 0.0, 0.0]
    else:
        (error,) = rundir.read_errors(run)
        assert rc != 0 and error["status"] == status and rundir.read_result(run) is None
        assert f"after {steps + 1} of 3 steps" in error["message"]
        assert message.split()[-1] in json.dumps(error)  # the tail of verl's output is in the record


def fake_package(root: Path, name: str, version: str, init: str = "", files: dict[str, str] | None = None) -> None:
    """An installed-looking package: its module folder and a dist-info that importlib.metadata reads."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(init)
    for rel, text in (files or {}).items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(text)
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.parametrize("version, init, files, refused", [
    ("1.16.0", "__version__ = '1.16.0'\n", {"experimental/__init__.py": ""}, True),
    ("1.12.0", "", {"experimental/__init__.py": "", "experimental/ppo/__init__.py":
                    "from .modeling_value_head import AutoModelForCausalLMWithValueHead\n"}, False),
    ("0.19.0", "_import_structure = {'models': ['AutoModelForCausalLMWithValueHead']}\n", {}, False),
])
def test_a_trl_without_the_value_head_verl_patches_is_refused_up_front(tmp_path, monkeypatch, version, init, files,
                                                                       refused):
    fake_package(tmp_path, "verl", "0.9.1")
    fake_package(tmp_path, "transfer_queue", "0.1.11")
    fake_package(tmp_path, "orjson", "3.11.0")
    fake_package(tmp_path, "trl", version, init, files)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "trl"]:  # another test may have imported the real one
        monkeypatch.delitem(sys.modules, name)
    if refused:
        with pytest.raises(ConfigError) as err:
            VerlRunner().check(recipe(), cuda_count=2)
        text = str(err.value)
        assert f"trl {version}" in text and "verl 0.9.1" in text and "trl<=1.12" in text, text
        assert text.count(". ") == 0 and text.endswith("."), text
    else:
        VerlRunner().check(recipe(), cuda_count=2)
    assert "trl" not in {m.split(".")[0] for m in sys.modules}  # found and read, never imported


def test_verl_without_the_transfer_queue_its_trainer_imports_is_refused_up_front(tmp_path, monkeypatch):
    fake_package(tmp_path, "verl", "0.9.1")
    fake_package(tmp_path, "trl", "1.12.0", "", {"experimental/__init__.py": "", "experimental/ppo/__init__.py":
                                                 "from .modeling_value_head import AutoModelForCausalLMWithValueHead\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("trl", "transfer_queue")]:
        monkeypatch.delitem(sys.modules, name)
    if importlib.util.find_spec("transfer_queue") is None:  # verl's environment has the real one
        with pytest.raises(ConfigError) as err:
            VerlRunner().check(recipe(), cuda_count=1)
        text = str(err.value)
        assert "transfer_queue" in text and "TransferQueue" in text and 'pip install -e ".[verl]"' in text, text
        assert text.count(". ") == 0 and text.endswith("."), text
    fake_package(tmp_path, "transfer_queue", "0.1.11")
    fake_package(tmp_path, "orjson", "3.11.0")
    importlib.invalidate_caches()
    VerlRunner().check(recipe(), cuda_count=1)


def test_without_trl_verl_is_not_refused_for_it(tmp_path, monkeypatch):
    fake_package(tmp_path, "verl", "0.9.1")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *(p for p in sys.path if "site-packages" not in p
                                                         and "dist-packages" not in p)])
    assert trl_conflict() is None


def test_engine_context_stays_within_the_models_positions(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 128}')
    o = overrides(recipe("task.max_new_tokens=64"), model=str(tmp_path), data_dir="/data", steps=5)
    assert o["actor_rollout_ref.rollout.max_model_len"] == 128


def tunekit_prompt_ids(text: str) -> list[int]:
    """The ids tunekit's own loop feeds for a prompt (the embedded tokenizer, as its trainer encodes prompts)."""
    from tunekit.workload import models
    from tunekit.trainer.batch import encode_prompts

    return encode_prompts(models.load_tokenizer(None), [text])["prompt_ids"][0].tolist()


def chat_ids(tokenizer, messages) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def verl_checkpoint(tmp_path_factory):
    """The checkpoint directory the verl runner writes for the embedded model, and the recipe."""
    from tunekit.runners.model_dir import prepare_model

    r = recipe()
    return r, prepare_model(r, tmp_path_factory.mktemp("verl-ckpt"), gpu=False, chat_rollout=True)


def test_verls_checkpoint_has_a_one_token_newline_and_renders_chats_as_tunekit_tokenizes_prompts(verl_checkpoint):
    import json

    from transformers import AutoTokenizer

    from tunekit.workload import models

    r, d = verl_checkpoint
    tok = AutoTokenizer.from_pretrained(str(d))  # what verl's hf_tokenizer does
    (newline,) = tok.encode("\n", add_special_tokens=False)
    assert newline not in models.load_tokenizer(None).get_vocab().values()  # a token of its own
    # the embedded model's embedding has no row for it: only a multi-turn rollout would insert it
    assert newline >= json.loads((d / "config.json").read_text())["vocab_size"]
    texts = [p.text for p in build_workload(r.task).probe_prompts(4, 2, r.probe.seed)]
    for text in texts:
        assert chat_ids(tok, [{"role": "user", "content": text}]) == tunekit_prompt_ids(text) != []
    half = len(texts[0]) // 2
    two = [{"role": "user", "content": texts[0][:half]}, {"role": "assistant", "content": texts[0][half:]}]
    assert chat_ids(tok, two) == tunekit_prompt_ids(texts[0])
    # the weights are the embedded model's, linked; the asset itself is untouched
    assert (d / "model.safetensors").resolve() == (models.EMBEDDED_MODEL_DIR / "model.safetensors").resolve()
    plain = AutoTokenizer.from_pretrained(str(models.EMBEDDED_MODEL_DIR))
    assert plain.encode("\n", add_special_tokens=False) == [] and not plain.chat_template


def test_trls_checkpoint_is_the_embedded_model_as_it_is(tmp_path):
    from transformers import AutoTokenizer

    from tunekit.workload import models
    from tunekit.runners.model_dir import prepare_model

    d = prepare_model(load_recipe(None, ["runner=trl"]), tmp_path, gpu=False)
    tok = AutoTokenizer.from_pretrained(str(d))
    assert d == models.EMBEDDED_MODEL_DIR and len(tok) == 19 and not tok.chat_template
    assert tok.encode("\n", add_special_tokens=False) == [] and not any(tmp_path.iterdir())


def test_a_checkpoints_own_chat_template_is_kept(tmp_path):
    from transformers import AutoTokenizer

    from tunekit.workload import models
    from tunekit.runners.model_dir import prepare_model

    own = tmp_path / "own"
    tok = models.load_tokenizer(None)
    tok.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    tok.save_pretrained(own)
    for f in models.EMBEDDED_MODEL_DIR.iterdir():
        if not (own / f.name).exists():
            (own / f.name).symlink_to(f)
    d = prepare_model(recipe(f"model.path={own}"), tmp_path / "run", gpu=False, chat_rollout=True)
    reloaded = AutoTokenizer.from_pretrained(str(d))
    assert d != own and reloaded.chat_template == tok.chat_template
    assert len(reloaded.encode("\n", add_special_tokens=False)) == 1
    # a checkpoint that needs nothing is loaded where it is
    reloaded.save_pretrained(own)
    assert prepare_model(recipe(f"model.path={own}"), tmp_path / "again", gpu=False, chat_rollout=True) == own


def test_a_prompt_the_checkpoint_would_tokenize_otherwise_is_refused(verl_checkpoint):
    from transformers import AutoTokenizer

    from tunekit.runners.model_dir import check_prompt_ids

    r, d = verl_checkpoint
    check_prompt_ids(r, d, ["12 + 3 =", "4 * 5 ="])
    with pytest.raises(ConfigError, match="task.prompt_template") as err:
        check_prompt_ids(r, d, ["12 + 3 =", "4 * 5\n="])
    assert "'4 * 5\\n='" in str(err.value)
    other = d.parent / "other"
    tok = AutoTokenizer.from_pretrained(str(d))
    tok.add_tokens(["12"])
    tok.save_pretrained(other)
    (other / "config.json").symlink_to(d / "config.json")
    with pytest.raises(ConfigError, match="model.tokenizer_path"):
        check_prompt_ids(r, other, ["4 * 5 =", "12 + 3 ="])


def test_a_probe_with_a_newline_in_its_prompts_stops_before_verl_starts(tmp_path, monkeypatch):
    from tunekit import rundir
    from tunekit.runners import verl_entry

    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "1 +\\n2 =", "answer": "3"}\n{"prompt": "2 + 2 =", "answer": "4"}\n')
    started = tmp_path / "started"
    (tmp_path / "marking_main_ppo.py").write_text(f"open({str(started)!r}, 'w').close()\n")
    monkeypatch.setattr(verl_runner, "ENTRY", "marking_main_ppo")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_config(run, recipe("probe.steps=2", "system.batch.prompts_per_step=8", f"task.dataset={data}"))
    assert verl_entry.main(str(run)) == 1
    (error,) = rundir.read_errors(run)
    assert error["status"] == "failed" and "has a newline" in error["message"]
    assert not started.exists()  # verl never started


def test_verls_continuous_token_builder_accepts_the_checkpoints_tokenizer(verl_checkpoint):
    """verl's own code on the checkpoint: the Qwen builder its agent loop makes for a qwen2 model, the tokenizer its
    model config loads (with the runner's chat template), and its dataset's overlong-prompt filter."""
    pytest.importorskip("verl", reason="verl is not installed (the verl extra)")
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import continuous_token_wiring
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder
    from verl.workers.config.model import HFModelConfig

    r, d = verl_checkpoint
    o = ov(r)
    config = HFModelConfig(path=str(d), custom_chat_template=o["actor_rollout_ref.model.custom_chat_template"])
    assert config.processor is None and config.hf_config.model_type == "qwen2"
    builder = continuous_token_wiring.create_continuous_token_builder(config.tokenizer, hf_model_type=config.hf_config.model_type)
    assert isinstance(builder, QwenContinuousTokenBuilder)
    texts = [p.text for p in build_workload(r.task).probe_prompts(4, 1, r.probe.seed)]
    for text in texts:
        ids = builder.build_initial_tokens([{"role": "user", "content": text}])
        assert ids == tunekit_prompt_ids(text)
        assert builder.merge_assistant_tokens(ids, [5, 2]).inserted_token_ids == []  # a single turn adds nothing
    data_dir = d.parent / "data"
    train, _ = write_data(r, data_dir, 2)
    data = OmegaConf.create({"max_prompt_length": o["data.max_prompt_length"], "filter_overlong_prompts": True,
                             "filter_overlong_prompts_workers": 1, "cache_dir": str(data_dir / "cache")})
    dataset = RLHFDataset(str(train), config.tokenizer, data)
    assert len(dataset) == len(pd.read_parquet(train)) == 2 * r.system.batch.prompts_per_step


def test_a_presets_checkpoint_for_verl_carries_the_chat_ready_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from tunekit.runners.model_dir import PLAIN_CHAT_TEMPLATE, prepare_model

    d = prepare_model(recipe("model.preset=tiny-arith"), tmp_path, gpu=False, chat_rollout=True)
    tok = AutoTokenizer.from_pretrained(str(d))
    assert (d / "model.safetensors").is_file() and tok.chat_template == PLAIN_CHAT_TEMPLATE
    assert len(tok.encode("\n", add_special_tokens=False)) == 1 and tok.encode("1 + 2 =") == tunekit_prompt_ids("1 + 2 =")


def test_verls_own_tokenization_is_checked_before_verl_starts(verl_checkpoint, tmp_path):
    """The probe renders its first prompts as verl's agent loop will, in a second, instead of minutes into verl's start."""
    pytest.importorskip("verl", reason="verl is not installed (the verl extra)")
    from tunekit.runners.model_dir import prepare_model
    from tunekit.runners.verl_entry import verl_renders_prompts

    r, d = verl_checkpoint
    texts = [p.text for p in build_workload(r.task).probe_prompts(4, 1, r.probe.seed)]
    verl_renders_prompts(r, d, texts)  # the checkpoint the runner writes: accepted, the same ids
    raw = prepare_model(r, tmp_path, gpu=False)  # the embedded tokenizer as it is: a newline encodes to nothing
    with pytest.raises(ConfigError, match="Expected Qwen newline to tokenize to one token"):
        verl_renders_prompts(r, raw, texts)


def test_a_reward_failing_inside_verl_is_found_in_its_output(tmp_path, monkeypatch):
    """The adapter raises the user's failure as tunekit's sentence; verl's output carries it, the probe reports it."""
    from tunekit.runners.verl_entry import reward_error
    from tunekit.workload import RewardError

    (tmp_path / "verl_bad_reward.py").write_text("def score(prompt, response, answer):\n    return float('inf')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(RewardError) as e:
            compute_score("src", "4", "4", {PROMPT_KEY: "2+2=", "index": 3}, tunekit_reward="verl_bad_reward:score")
    finally:
        sys.modules.pop("verl_bad_reward", None)
    sentence = e.value.message
    assert sentence.startswith("task.reward 'verl_bad_reward:score' returned inf") and "row 3 ('2+2=')" in sentence
    line = f"(TaskRunner pid=77) tunekit.workload.reward.RewardError: {sentence}"
    assert reward_error(line) == sentence
    assert reward_error("ray.exceptions.RayTaskError(RewardError): ray::TaskRunner.run()") is None
