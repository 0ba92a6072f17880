"""The ``verl`` runner: a probe is verl's own PPO entry point, ``python -m verl.trainer.main_ppo``, with tunekit's
knobs written as verl's Hydra overrides (verl 0.9: its V1 trainer, a Ray driver dispatching to FSDP worker groups
and a colocated vLLM engine that sleeps while the actor trains).

How each knob reaches verl (:func:`overrides`; a knob verl cannot express is refused by :meth:`VerlRunner.check`, from
:mod:`tunekit.runners.verl_refusals`):

=====================================  =======================================================================
tunekit                                verl
=====================================  =======================================================================
algorithm.name ppo / grpo              ``algorithm.adv_estimator`` gae / grpo (a critic only with gae)
algorithm.gamma / lam                  ``algorithm.gamma`` / ``lam``
algorithm.kl_coef, KL in the loss      ``actor.use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``
algorithm.kl_coef, KL in the reward    ``algorithm.use_kl_in_reward``, ``kl_penalty``, ``kl_ctrl`` (fixed)
algorithm.kl_estimator k1/k3/abs/mse   ``kl``/``low_var_kl``/``abs``/``mse``
algorithm.clip_ratio_low / _high / _c  ``actor.clip_ratio_low`` / ``clip_ratio_high`` / ``clip_ratio_c``
algorithm.loss_agg_mode                ``actor.loss_agg_mode`` (the same three names)
algorithm.entropy_coef                 ``actor.entropy_coeff``
algorithm.ppo_epochs                   ``actor.ppo_epochs`` (the critic follows)
algorithm.actor_lr / critic_lr         ``actor.optim.lr`` / ``critic.optim.lr`` (verl's constant schedule)
algorithm.max_grad_norm                ``actor.optim.clip_grad``, ``critic.optim.clip_grad``
algorithm.value_clip                   ``critic.cliprange_value``
system.batch.prompts_per_step          ``data.train_batch_size`` (prompts)
system.batch.samples_per_prompt        ``rollout.n``
system.batch.mini_batch_size           ``actor.ppo_mini_batch_size`` = mini-batch / samples per prompt (verl counts
                                       prompts)
system.batch.micro_batch_size          ``ppo_micro_batch_size_per_gpu`` (actor, critic) and
                                       ``log_prob_micro_batch_size_per_gpu`` (rollout, ref)
task.max_new_tokens                    ``data.max_response_length``; prompts get ``data.max_prompt_length`` =
                                       tunekit's prompt budget (verl 0.9's agent loop keeps each prompt's own tokens
                                       and its engine pads a micro-batch to its longest sequence, so the budget costs
                                       no compute); the engine's ``rollout.max_model_len`` is their sum (verl's default
                                       is the model's whole context, which the KV cache must hold)
task.temperature / fixed_length        ``rollout.temperature`` / ``rollout.ignore_eos``
system.memory.fsdp_single_gpu          verl always trains under FSDP (``auto`` and ``true`` alike; ``false`` is refused)
system.memory.param_offload            ``fsdp_config.param_offload`` + ``optimizer_offload`` (actor, ref, critic)
system.memory.reshard_after_forward    ``fsdp_config.reshard_after_forward``
system.memory.gradient_checkpointing   ``model.enable_gradient_checkpointing`` (actor, critic)
system.memory.master_weights           no effect: it concerns a plain module, and verl trains under FSDP's mixed
                                       precision (bf16 compute over fp32 masters) always
system.cuda_graphs                     no effect, for the same reason (it concerns a compiled plain module)
system.compile                         ``actor.fsdp_config.use_torch_compile`` (``auto``: verl's default, on), which
                                       in verl 0.9's FSDP engine compiles the entropy function only: the model
                                       trains eager (``true`` is refused)
system.rollout (backend vllm)          ``rollout.name=vllm``, ``tensor_model_parallel_size`` = tensor_parallel_size,
                                       ``gpu_memory_utilization``, ``free_cache_engine`` = enable_sleep (verl sleeps
                                       at level 2), ``enforce_eager`` (not eager: ``cudagraph_capture_sizes`` up to
                                       the probe's decode batch); ``max_num_seqs``, ``max_num_batched_tokens``,
                                       ``enable_prefix_caching``, ``enable_chunked_prefill`` when set (else verl's);
                                       ``logprobs`` = ``calculate_log_probs`` when not auto (else verl's, off)
system.device_map (n GPUs)             ``trainer.n_gpus_per_node`` = n, ``trainer.nnodes=1``: every role on them all
probe.steps                            ``trainer.total_training_steps``; no saving, no validation; a probe also
                                       starts without a resume search or dataloader processes (:data:`PROBE_START`)
probe.eval_every, eval_before_train    ``trainer.test_freq``, ``trainer.val_before_train``, greedy ``val_kwargs``
                                       (:func:`evaluation`); the held-out prompts are ``data.val_files``
=====================================  =======================================================================

The prompt reaches the model as tunekit's other runners feed it: through the tokenizer's own chat template, by verl's
own rendering, where the recipe's prompts go through one (``task.chat_template``), else as its text (a chat template
that joins the messages' contents). Without ``flash_attn`` installed the models load with ``sdpa`` attention and without
verl's padding removal (which needs flash-attention's variable-length kernels). verl whitens GAE advantages always
and GRPO's never (``algorithm.whiten_advantages``: only ppo with false is refused).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from tunekit.config import PROMPT_TOKEN_BUDGET, Recipe, dump_recipe
from tunekit.trainer.rollout.engine_io import most_sequences
from tunekit.config.errors import ConfigError
from tunekit.placement.gpus import on_gpu, visible_devices
from tunekit.runners import verl_reward
from tunekit.rundir import compile_cache_dir
from tunekit.estimate.traits import RunnerTraits
from tunekit.runners.base import RECIPE_FILE, Handback, Runner, check_framework, compile_cache_env, probe_env
from tunekit.runners.model_dir import MODEL_COPY, PLAIN_CHAT_TEMPLATE, handback_model, needs_own_copy
from tunekit.runners.verl_refusals import gpus, missing_companion, refusals, trl_conflict

ENTRY = "verl.trainer.main_ppo"
DATA_DIR = "verl-data"
TRAIN = "train.parquet"
VAL = "val.parquet"
"""The files :mod:`tunekit.runners.verl_data` writes (a module the package does not import, so that
``python -m tunekit.runners.verl_data`` runs it once)."""
KL_TYPES = {"k1": "kl", "k3": "low_var_kl", "abs": "abs", "mse": "mse"}
"""tunekit's KL estimator -> verl's name for it (``kl_loss_type`` / ``kl_penalty``)."""
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
"""Where verl's ``file`` logger writes one JSON line per step (:mod:`tunekit.runners.verl_records` reads it)."""


def has_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


AR = "actor_rollout_ref"
"""verl's config group for the policy, its vLLM engine and the reference policy, which share its ``model`` section."""
ACTOR = f"{AR}.actor"


TOTAL_STEPS = "trainer.total_training_steps"
SAVE_FREQ = "trainer.save_freq"
"""verl saves a checkpoint every that many steps and at the last (-1: never)."""


def overrides(recipe: Recipe, *, model: str, data_dir: str, steps: int) -> dict[str, Any]:
    """tunekit's knobs as verl's Hydra overrides (key -> value; a key verl's config lacks starts with ``+``),
    for a run of ``steps`` steps on the checkpoint ``model`` and the parquet files in ``data_dir``."""
    return (_algorithm(recipe) | _data(recipe, data_dir) | _actor(recipe, model) | _rollout(recipe, model)
            | _ref(recipe) | _reward(recipe) | _trainer(recipe, steps) | _critic(recipe, model))


def _algorithm(recipe: Recipe) -> dict[str, Any]:
    """``algorithm``: the advantage estimator, its discounting, and the KL term when it goes into the reward."""
    a = recipe.algorithm
    out: dict[str, Any] = {"algorithm.adv_estimator": "gae" if a.name == "ppo" else "grpo", "algorithm.gamma": a.gamma,
                           "algorithm.lam": a.lam, "algorithm.use_kl_in_reward": a.kl_in_reward}
    if a.kl_in_reward:
        out |= {"algorithm.kl_penalty": KL_TYPES[a.kl_kind], "algorithm.kl_ctrl.type": "fixed",
                "algorithm.kl_ctrl.kl_coef": a.kl_coef}
    return out


def _data(recipe: Recipe, data_dir: str) -> dict[str, Any]:
    """``data``: the parquet files, the step batch in prompts (unshuffled) and the prompt and response budgets."""
    out: dict[str, Any] = {
        "data.train_files": f"{data_dir}/{TRAIN}", "data.val_files": f"{data_dir}/{VAL}",
        "data.train_batch_size": recipe.system.batch.prompts_per_step, "data.shuffle": False,
        "data.max_prompt_length": PROMPT_TOKEN_BUDGET, "data.max_response_length": recipe.task.max_new_tokens}
    if recipe.model.trust_remote_code:
        out["data.trust_remote_code"] = True
    return out


def _model(prefix: str, recipe: Recipe, model: str) -> dict[str, Any]:
    """``<prefix>.model`` (the policy's or the critic's): the checkpoint, gradient checkpointing, remote code, and
    ``sdpa`` attention without padding removal when flash-attention is not installed."""
    out: dict[str, Any] = {f"{prefix}.model.path": model,
                           f"{prefix}.model.enable_gradient_checkpointing": recipe.system.memory.gradient_checkpointing}
    if recipe.model.trust_remote_code:
        out[f"{prefix}.model.trust_remote_code"] = True
    if not has_flash_attn():
        out |= {f"+{prefix}.model.override_config.attn_implementation": "sdpa",
                f"{prefix}.model.use_remove_padding": False}
    return out


def chat_template(recipe: Recipe) -> dict[str, Any]:
    """verl renders every prompt through the tokenizer's chat template: its own where the recipe's prompts go through
    it (``task.chat_template``), else one that gives the prompt's text as it is, as tunekit's loop feeds it."""
    from tunekit.trainer.build import load_tokenizer
    from tunekit.workload.chat import prompt_format

    if prompt_format(recipe.task, load_tokenizer(recipe)).chat:
        return {}
    return {f"{AR}.model.custom_chat_template": PLAIN_CHAT_TEMPLATE}


def _actor(recipe: Recipe, model: str) -> dict[str, Any]:
    """The policy: its model, optimiser, PPO batch and clipping, FSDP memory knobs, the KL term when it goes into the
    loss, and its engine's torch.compile (of the entropy function) when ``system.compile`` is false."""
    a, b, mem = recipe.algorithm, recipe.system.batch, recipe.system.memory
    out = _model(AR, recipe, model) | chat_template(recipe) | {
        f"{ACTOR}.optim.lr": a.actor_lr, f"{ACTOR}.optim.clip_grad": a.max_grad_norm,
        f"{ACTOR}.ppo_epochs": a.ppo_epochs,
        f"{ACTOR}.ppo_mini_batch_size": b.mini_batch // b.samples_per_prompt,
        f"{ACTOR}.ppo_micro_batch_size_per_gpu": b.micro_batch,
        f"{ACTOR}.clip_ratio_low": a.clip_low, f"{ACTOR}.clip_ratio_high": a.clip_high,
        f"{ACTOR}.clip_ratio_c": a.clip_ratio_c, f"{ACTOR}.loss_agg_mode": a.loss_agg_mode,
        f"{ACTOR}.entropy_coeff": a.entropy_coef,
        f"{ACTOR}.fsdp_config.param_offload": mem.param_offload,
        f"{ACTOR}.fsdp_config.optimizer_offload": mem.param_offload,
        f"{ACTOR}.fsdp_config.reshard_after_forward": mem.reshard_after_forward,
        f"{ACTOR}.use_kl_loss": a.kl_in_loss}
    if a.kl_in_loss:
        out |= {f"{ACTOR}.kl_loss_coef": a.kl_coef, f"{ACTOR}.kl_loss_type": KL_TYPES[a.kl_kind]}
    if recipe.system.compile is False:
        out[f"{ACTOR}.fsdp_config.use_torch_compile"] = False
    return out


VERL_MAX_NUM_SEQS = 256
"""verl 0.9's ``rollout.max_num_seqs`` where the recipe sets none (``rollout/rollout.yaml``): its engine decodes
no more sequences at once, so no CUDA graph is captured for more."""


def _rollout(recipe: Recipe, model: str) -> dict[str, Any]:
    """The colocated vLLM engine: samples per prompt, parallelism, memory and sleep, sampling, its context (a prompt
    plus a response), and the scheduler knobs that are set (verl's own values otherwise)."""
    from tunekit.trainer.rollout.checkpoint import max_model_len

    b, t, rc, rollout = recipe.system.batch, recipe.task, recipe.system.rollout, f"{AR}.rollout"
    out: dict[str, Any] = {
        f"{rollout}.name": "vllm", f"{rollout}.n": b.samples_per_prompt,
        f"{rollout}.tensor_model_parallel_size": rc.tensor_parallel_size,
        f"{rollout}.gpu_memory_utilization": rc.gpu_memory_utilization,
        f"{rollout}.free_cache_engine": rc.enable_sleep, f"{rollout}.enforce_eager": rc.enforce_eager,
        f"{rollout}.temperature": t.temperature, f"{rollout}.ignore_eos": t.fixed_length,
        f"{rollout}.seed": recipe.probe.seed, f"{rollout}.max_model_len": max_model_len(model, t.max_new_tokens),
        f"{rollout}.log_prob_micro_batch_size_per_gpu": b.micro_batch}
    for key in ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill"):
        if getattr(rc, key) is not None:
            out[f"{rollout}.{key}"] = getattr(rc, key)
    if rc.logprobs != "auto":
        out[f"{rollout}.calculate_log_probs"] = rc.logprobs
    if not rc.enforce_eager:  # CUDA graphs for the decode batches the probe can run, not up to vLLM's default
        out[f"{rollout}.cudagraph_capture_sizes"] = capture_sizes(min(most_sequences(recipe),
                                                                      rc.max_num_seqs or VERL_MAX_NUM_SEQS))
    return out


def capture_sizes(most: int) -> list[int]:
    """vLLM's own pattern of CUDA-graph batch sizes (1, 2, 4, then every 8), up to and including ``most``."""
    return sorted({s for s in (1, 2, 4, *range(8, most, 8)) if s < most} | {most})


def _ref(recipe: Recipe) -> dict[str, Any]:
    """The reference policy: its log-prob micro-batch and parameter offload."""
    return {f"{AR}.ref.log_prob_micro_batch_size_per_gpu": recipe.system.batch.micro_batch,
            f"{AR}.ref.fsdp_config.param_offload": recipe.system.memory.param_offload}


def _reward(recipe: Recipe) -> dict[str, Any]:
    """``reward``: tunekit's reward function (:mod:`tunekit.runners.verl_reward`), told which task.reward to call."""
    return {"reward.custom_reward_function.path": str(Path(verl_reward.__file__).resolve()),
            "reward.custom_reward_function.name": "compute_score",
            f"+reward.custom_reward_function.reward_kwargs.{verl_reward.REWARD_KWARG}": recipe.task.reward}


def _trainer(recipe: Recipe, steps: int) -> dict[str, Any]:
    """``trainer``: one node of :func:`gpus` GPUs, ``steps`` steps, no saving or validation, a step log file."""
    return {"trainer.n_gpus_per_node": gpus(recipe), "trainer.nnodes": 1,
            TOTAL_STEPS: steps, SAVE_FREQ: -1, "trainer.test_freq": -1,
            "trainer.val_before_train": False, "trainer.logger": ["console", "file"],
            "trainer.project_name": "tunekit", "trainer.experiment_name": recipe.name}


def _critic(recipe: Recipe, model: str) -> dict[str, Any]:
    """``critic`` (ppo only, else empty): its model, optimiser, value clipping, micro-batch and FSDP memory knobs."""
    a, b, mem = recipe.algorithm, recipe.system.batch, recipe.system.memory
    if not a.uses_critic:
        return {}
    return _model("critic", recipe, model) | {
        "critic.optim.lr": a.critic_lr, "critic.optim.clip_grad": a.max_grad_norm,
        "critic.cliprange_value": a.value_clip, "critic.ppo_micro_batch_size_per_gpu": b.micro_batch,
        "critic.fsdp.param_offload": mem.param_offload, "critic.fsdp.optimizer_offload": mem.param_offload,
        "critic.fsdp.reshard_after_forward": mem.reshard_after_forward}


_PLAIN = re.compile(r"[A-Za-z0-9_./\-+@~]+")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted unless plainly one word or path)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null") and not _is_number(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def hydra_args(values: dict[str, Any]) -> list[str]:
    return [f"{k}={hydra_value(v)}" for k, v in values.items()]


PROBE_START = {"trainer.resume_mode": "disable", "data.dataloader_num_workers": 0,
               "+ray_kwargs.ray_init.include_dashboard": False}
"""What a probe adds to a run's overrides to start sooner without changing a step: no search for a checkpoint to
resume (a fresh start), the prompts read in the driver (a step's few kilobytes) rather than by eight dataloader
processes started first, and Ray's local cluster without its dashboard (``ray_kwargs.ray_init`` is handed to
``ray.init`` as it is; the dashboard only serves Ray's web view, which no probe opens, and the probe reads verl's
output rather than Ray's state). Where the start-up goes is read off verl's output
(:mod:`tunekit.runners.verl_startup`). Already in every probe's overrides (:func:`_trainer`, :func:`_rollout`): no validation
(with evaluation on, at ``probe.eval_every`` and before training as ``probe.eval_before_train`` says), no saving, no wandb, the engine eager unless ``system.rollout.enforce_eager`` is false
(then its CUDA graphs only up to the probe's decode batch, :func:`capture_sizes`), and tunekit's shared compile
cache for verl's compiled actor (:func:`tunekit.runners.base.compile_cache_env`). verl's vLLM servers compile cold
in every probe all the same: verl's Ray runtime environment sets ``VLLM_DISABLE_COMPILE_CACHE=1`` (unless the
environment already names it), which no verl option changes."""


def evaluation(recipe: Recipe, validations: Path | None = None) -> dict[str, Any]:
    """verl's validation on the held-out prompts (the val file) every ``probe.eval_every`` steps (and at its last,
    as verl does) and, with ``probe.eval_before_train``, before the first, one greedy response a prompt; with
    ``validations``, each validation's responses dumped there (``trainer.validation_data_dir``)."""
    rollout = "actor_rollout_ref.rollout.val_kwargs"
    values = {"trainer.test_freq": recipe.probe.eval_every, "trainer.val_before_train": recipe.probe.eval_before_train,
              f"{rollout}.do_sample": False, f"{rollout}.n": 1, f"{rollout}.temperature": 0}
    return values | ({"trainer.validation_data_dir": str(validations)} if validations is not None else {})


def probe_args(recipe: Recipe, *, model: Path, data_dir: Path, generations: Path | None = None,
               validations: Path | None = None) -> list[str]:
    """The probe's verl command line after ``python -m verl.trainer.main_ppo``: the recipe's overrides,
    :data:`PROBE_START` and, with ``generations``, each step's rollouts dumped there (``trainer.rollout_data_dir``:
    what the probe's samples are read from) and, with evaluation on, its validation (:func:`evaluation`; its
    responses dumped into ``validations``)."""
    values = overrides(recipe, model=str(model), data_dir=str(data_dir), steps=recipe.probe.steps)
    if generations is not None:
        values["trainer.rollout_data_dir"] = str(generations)
    if recipe.evaluates:
        values |= evaluation(recipe, validations)
    return hydra_args(values | PROBE_START)


class VerlRunner(Runner):
    """verl's PPO trainer as the probe's process tree: ``python -m tunekit.runners.verl_entry RUN_DIR`` writes the
    checkpoint and data files, runs ``python -m verl.trainer.main_ppo`` and turns its step log into tunekit's."""

    name = "verl"
    # always FSDP's mixed precision, its training never compiled
    traits = RunnerTraits(bf16_beside_masters=False, plain_ref_bf16=False, training_graphs=False,
                          engine_graphs_outside=False, wakes_beside_cache=False, graphs_any_batch=False)

    def check(self, recipe: Recipe, cuda_count: int) -> None:
        """Refuse, in one sentence naming the key, what verl cannot express; nothing is launched."""
        check_framework("verl", refusals(recipe, on_gpu(recipe.system.device, cuda_count)), "verl", "verl")
        for problem in (trl_conflict(), missing_companion()):
            if problem is not None:
                raise ConfigError(problem)

    def refusal(self, recipe: Recipe, *, gpu: bool) -> str | None:
        return next(iter(refusals(recipe, gpu)), None)

    def command(self, recipe: Recipe, run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "tunekit.runners.verl_entry", str(run_dir)]

    def env(self, recipe: Recipe, run_dir: Path | None, *, on_gpu: bool) -> dict[str, str]:
        env = probe_env(run_dir, on_gpu=on_gpu)
        # verl runs in its own working directory; a reward module beside the user's recipe still imports
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.getcwd()])
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # as tunekit's engines: flashinfer is not everywhere
        env.setdefault("WANDB_MODE", "disabled")
        if on_gpu:  # verl places every role on every GPU it sees
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(recipe.system.devices, env)
        if on_gpu and run_dir is not None:  # verl's compiled entropy and its vLLM engine (Ray's workers inherit it)
            env |= compile_cache_env(compile_cache_dir(run_dir), env)
        return env

    def training_path(self, recipe: Recipe, *, gpu: bool) -> dict[str, bool]:
        """verl's actor: always FSDP, never compiled (verl 0.9's FSDP engine compiles only its entropy function);
        its trainer recomputes the old policy's logprobs every step (outside its ``bypass_mode``, off by default)."""
        return {"resolved/fsdp": True, "resolved/compile": False, "resolved/master_weights": False,
                "resolved/cuda_graphs": False, "resolved/old_logprob": True}

    def handback(self, recipe: Recipe, steps: int, *, gpu_profile: str | None = None) -> Handback:
        """``recipe`` as verl's own command for the full run's ``steps``: the data files written from the winner's
        recipe first, then ``python -m verl.trainer.main_ppo`` with its overrides.

        The data step also gives verl its checkpoint where the probes' was not the recipe's as it stands: a copy with
        the tokenizer verl's rollout needs, or a link to a converted checkpoint (a pretrained preset, a ``.gguf``
        file), converted on the machine the run starts on if its cache lacks it; the recipe file keeps the preset."""
        from tunekit.workload.pretrained import converts, resolve_model

        full = recipe.model_copy(update={"probe": recipe.probe.model_copy(update={"steps": steps})})
        model, own = handback_model(recipe), needs_own_copy(recipe) or converts(recipe.model)
        resolved = resolve_model(full)  # the overrides as the probes had them (the converted tokenizer's template)
        # the run's length is the shell variable STEPS, set first: both commands read it
        data = shlex.join(["python", "-m", "tunekit.runners.verl_data", RECIPE_FILE, DATA_DIR, *(["--model"] if own else []),
                           "--steps"]) + " $STEPS"
        args = overrides(resolved, model=model, data_dir=DATA_DIR, steps=steps)
        if recipe.evaluates:  # the probes' evaluation, as often, on the same held-out prompts (the val file)
            args |= evaluation(resolved)
        args.pop(TOTAL_STEPS)
        args.pop(SAVE_FREQ)  # the probes save nothing; the run saves its last step (verl's checkpoint, every role)
        # the files the data step writes by absolute path: a Ray cluster already up on the machine runs its workers
        # in another directory
        written = {k: args.pop(k) for k in ("data.train_files", "data.val_files")}
        if own:  # every model path (actor, rollout, critic) at the data step's copy or link
            for key in [k for k, v in args.items() if v == model]:
                del args[key]
                written[key] = f"{DATA_DIR}/{MODEL_COPY}"
        train = (shlex.join(["python", "-m", ENTRY, *hydra_args(args)]) + f" {TOTAL_STEPS}=$STEPS {SAVE_FREQ}=$STEPS"
                 + "".join(f' {k}="$PWD"/{v}' for k, v in written.items()))
        devices = f"CUDA_VISIBLE_DEVICES={visible_devices(recipe.system.devices)} "
        return Handback(command=f"STEPS={steps} && {data} && {devices}{train}", files={RECIPE_FILE: dump_recipe(full)})

