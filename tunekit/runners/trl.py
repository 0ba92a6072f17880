"""The ``trl`` runner: a probe is TRL's ``GRPOTrainer`` with tunekit's knobs written as TRL's own arguments.

The installed TRL (1.x) ships ``GRPOTrainer`` and ``RLOOTrainer`` as its on-policy RL trainers; its PPO trainer is
gone (no ``PPOTrainer`` in ``trl`` nor ``trl.experimental``), so ``algorithm.name=ppo`` is refused here.

How each knob reaches TRL (:func:`grpo_args`; a knob TRL cannot express is refused by :meth:`TrlRunner.check`):

==================================  ==========================================================================
tunekit                             TRL
==================================  ==========================================================================
system.rollout.backend hf           ``use_vllm=False`` (transformers ``generate`` on the policy)
system.rollout.backend vllm         ``use_vllm=True, vllm_mode="colocate"``, ``vllm_enable_sleep_mode``,
                                    ``vllm_gpu_memory_utilization`` (TRL's engine: vLLM's default CUDA graphs +
                                    torch.compile, sleep level 2)
system.rollout.backend vllm_server  ``vllm_mode="server"``: ``trl vllm-serve`` started on the rollout GPUs, or
                                    ``vllm_server_base_url`` = ``system.rollout.server_url``
rollout.tensor_parallel_size        ``vllm_tensor_parallel_size`` (colocated); ``--tensor-parallel-size``, and
                                    ``--data-parallel-size`` = the replicas (server)
system.batch.samples_per_prompt     ``num_generations``
system.batch.micro_batch_size       ``per_device_train_batch_size``
system.batch.mini_batch_size        ``gradient_accumulation_steps`` = mini-batch / (micro-batch x ranks)
prompts x samples per step          ``steps_per_generation`` = step batch / (micro-batch x ranks)
algorithm.ppo_epochs                ``num_iterations``
algorithm.actor_lr                  ``learning_rate`` (``lr_scheduler_type="constant"``, as tunekit's)
algorithm.kl_coef                   ``beta`` (TRL's KL: the k3 estimator, a loss term; in the reward is refused)
algorithm.clip_ratio_low / _high    ``epsilon`` / ``epsilon_high``
algorithm.clip_ratio_c (dual-clip)  ``delta`` (TRL's two-sided clip: the same cap for negative advantages)
algorithm.loss_agg_mode             ``loss_type``: token-mean ``dapo``, seq-mean-token-mean ``grpo``,
                                    seq-mean-token-sum-norm ``dr_grpo``
algorithm.entropy_coef              ``entropy_coef``
algorithm.max_grad_norm             ``max_grad_norm``
task.max_new_tokens / temperature   ``max_completion_length`` / ``temperature``
task.fixed_length                   ``generation_kwargs`` (vLLM ``min_tokens`` + ``ignore_eos``; HF ``min_new_tokens``)
system.memory.gradient_checkpointing ``gradient_checkpointing`` (TRL's default is on: always written)
system.compile                      ``torch_compile`` (``auto``: TRL's default, off)
model.dtype                         ``bf16`` + ``model_init_kwargs.dtype`` (auto: fp32 weights, bf16 autocast on GPU)
system.memory.master_weights        ``auto`` / ``false``: TRL's plain module keeps fp32 weights under bf16 autocast;
                                    ``true`` (bf16 weights beside fp32 masters) is refused
system.cuda_graphs                  ``auto`` / ``false``: TRL's ``torch_compile`` compiles in torch's default
                                    mode, without CUDA graphs; ``true`` is refused
system.device_map (n GPUs)          n ranks (one: the probe's own process; more: torchrun); FSDP2 (``fsdp``,
                                    ``fsdp_config.reshard_after_forward``, ``cpu_offload`` = param + optimizer
                                    offload) on several GPUs, or on one with offload or
                                    ``system.memory.fsdp_single_gpu: true``; else the plain module
==================================  ==========================================================================

Every other argument keeps TRL's default, as a TRL user's run would: with vLLM that includes
``vllm_importance_sampling_correction`` (an extra forward for the old policy's logprobs each step, in
``timing_s/old_logprob``; tunekit's trainer takes them from the update's own forward when it is on-policy).

A step of the probe is one generation batch: ``(step batch / mini-batch) x ppo_epochs`` optimizer steps of TRL's.
"""

from __future__ import annotations

import json
import pprint
import shlex
import sys
from pathlib import Path
from typing import Any

from tunekit.config import Recipe
from tunekit.placement.gpus import on_gpu, visible_devices
from tunekit.rundir import compile_cache_dir
from tunekit.estimate.traits import RunnerTraits
from tunekit.runners.base import Handback, Runner, check_framework, compile_cache_env, probe_env
from tunekit.placement.backends import backend_of, trainer_devices, trainer_world_size
from tunekit.trainer.rollout.engine_io import engine_knobs

LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
"""``algorithm.loss_agg_mode`` -> TRL's ``loss_type`` that aggregates the per-token loss the same way."""

LAUNCH_FILE = "trl_launch.py"
"""The winner in TRL's words, written next to a search's ``search.json``."""


def ranks(recipe: Recipe, gpu: bool) -> int:
    """Training processes: one per trainer GPU, one on CPU."""
    return trainer_world_size(recipe.system) if gpu else 1


def uses_fsdp(recipe: Recipe, gpu: bool) -> bool:
    """FSDP2 under TRL: on GPUs, where :meth:`MemoryConfig.shards` says so (TRL on CPU runs the plain module)."""
    return gpu and recipe.system.memory.shards(gpu=gpu, world=ranks(recipe, gpu))


def uses_compile(recipe: Recipe) -> bool:
    """TRL's ``torch_compile``: only when ``system.compile`` is ``true``; ``auto`` keeps TRL's default (off), as
    a TRL user's run has it (not measured faster under TRL's trainer)."""
    return recipe.system.compile is True


def optimizer_steps_per_step(recipe: Recipe) -> int:
    """TRL optimizer steps in one probe step (one generation batch)."""
    b = recipe.system.batch
    return b.samples_per_step // b.mini_batch * recipe.algorithm.ppo_epochs


def grpo_args(recipe: Recipe, *, gpu: bool) -> dict[str, Any]:
    """tunekit's knobs as ``GRPOConfig`` keyword arguments, for the user's run (no probe-only arguments).

    The server URL of a ``vllm_server`` rollout that tunekit starts, and the engine's context length, are the
    launch's to add (:mod:`tunekit.runners.trl_entry`).
    """
    a, b, t, s, m = recipe.algorithm, recipe.system.batch, recipe.task, recipe.system, recipe.model
    rows = b.micro_batch * ranks(recipe, gpu)
    args: dict[str, Any] = {
        "learning_rate": a.actor_lr, "lr_scheduler_type": "constant", "max_grad_norm": a.max_grad_norm,
        "beta": a.kl_coef, "epsilon": a.clip_low, "delta": a.clip_ratio_c, "loss_type": LOSS_TYPES[a.loss_agg_mode],
        "num_iterations": a.ppo_epochs,
        "num_generations": b.samples_per_prompt, "per_device_train_batch_size": b.micro_batch,
        "gradient_accumulation_steps": b.mini_batch // rows, "steps_per_generation": b.samples_per_step // rows,
        "max_completion_length": t.max_new_tokens, "temperature": t.temperature,
        "gradient_checkpointing": s.memory.gradient_checkpointing, "torch_compile": uses_compile(recipe),
        "bf16": gpu and m.dtype != "float32",
        "model_init_kwargs": {"dtype": "bfloat16" if m.dtype == "bfloat16" else "float32"},
        "seed": recipe.probe.seed,
    }
    if a.clip_high != a.clip_low:
        args["epsilon_high"] = a.clip_high
    if a.entropy_coef:
        args["entropy_coef"] = a.entropy_coef
    if m.trust_remote_code:
        args["trust_remote_code"] = True
    backend = s.rollout.backend
    if t.fixed_length:
        n = t.max_new_tokens
        args["generation_kwargs"] = {"min_tokens": n, "ignore_eos": True} if backend != "hf" else {"min_new_tokens": n}
    if backend == "vllm":
        args |= {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": s.rollout.enable_sleep,
                 "vllm_gpu_memory_utilization": s.rollout.gpu_memory_utilization,
                 "vllm_tensor_parallel_size": s.rollout.tensor_parallel_size}
    elif backend == "vllm_server":
        args |= {"use_vllm": True, "vllm_mode": "server", "vllm_server_timeout": s.rollout.server_timeout_s}
        if s.rollout.server_url:
            args["vllm_server_base_url"] = s.rollout.server_url
    if uses_fsdp(recipe, gpu):
        args |= {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": s.memory.reshard_after_forward,
                                                       "cpu_offload": s.memory.param_offload}}
    return args


def server_args(recipe: Recipe) -> list[str]:
    """``trl vllm-serve`` arguments for the rollout GPUs (the model, port and context length are the launch's): one
    server whose engines are the rollout replicas (data parallel) of ``tensor_parallel_size`` GPUs each."""
    rc = recipe.system.rollout
    out = ["--tensor-parallel-size", str(rc.tensor_parallel_size),
           "--data-parallel-size", str(max(1, len(recipe.system.rollout_replicas))),
           "--gpu-memory-utilization", str(rc.gpu_memory_utilization)]
    if rc.enforce_eager:
        out.append("--enforce-eager")
    elif not rc.torch_compile:  # extra arguments reach `vllm serve` as they are
        from tunekit.trainer.rollout.engine_io import compilation_config, most_sequences

        out += ["--compilation-config", json.dumps(compilation_config(False, False, most_sequences(recipe)))]
    if recipe.model.trust_remote_code:
        out.append("--trust-remote-code")
    return out


class TrlRunner(Runner):
    """TRL's GRPOTrainer as the probe's process tree: ``python -m tunekit.runners.trl_entry RUN_DIR``
    (which starts the ranks and, for ``vllm_server``, ``trl vllm-serve``)."""

    name = "trl"
    # autocast over fp32 weights, or FSDP's mixed precision; its colocated engine captures CUDA graphs too, and is
    # estimated within its NVML peak without counting them; it empties the cache before each wake
    traits = RunnerTraits(bf16_beside_masters=False, plain_ref_bf16=False, training_graphs=False,
                          engine_graphs_outside=False, wakes_beside_cache=False, graphs_any_batch=False)

    def check(self, recipe: Recipe, cuda_count: int) -> None:
        """Refuse, in one sentence naming the key, what TRL cannot express; nothing is launched."""
        check_framework("trl", refusals(recipe, on_gpu(recipe.system.device, cuda_count)), "trl", "TRL")

    def refusal(self, recipe: Recipe, *, gpu: bool) -> str | None:
        return next(iter(refusals(recipe, gpu)), None)

    def command(self, recipe: Recipe, run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "tunekit.runners.trl_entry", str(run_dir)]

    def env(self, recipe: Recipe, run_dir: Path | None, *, on_gpu: bool) -> dict[str, str]:
        env = probe_env(run_dir, on_gpu=on_gpu)
        # a probe loads local files only: a hub lookup fails at once instead of waiting on the network
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # as tunekit's engines: flashinfer is not everywhere
        if on_gpu:  # the ranks' GPUs; a server tunekit starts takes the rollout GPUs by their physical ids
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(trainer_devices(recipe.system), env)
        if on_gpu and run_dir is not None:  # TRL's torch_compile and its vLLM engine
            env |= compile_cache_env(compile_cache_dir(run_dir), env)
        return env

    def training_path(self, recipe: Recipe, *, gpu: bool) -> dict[str, bool]:
        """TRL's model as :func:`uses_fsdp` and :func:`uses_compile` say; old logprobs each step under vLLM (its
        ``vllm_importance_sampling_correction``, on by default) or where the optimizer steps span the batch."""
        return {"resolved/fsdp": uses_fsdp(recipe, gpu), "resolved/compile": uses_compile(recipe),
                "resolved/master_weights": False,  # autocast over fp32 weights, or FSDP's mixed precision
                "resolved/cuda_graphs": False,
                "resolved/old_logprob": recipe.system.rollout.backend != "hf" or recipe.recomputes_old_logprobs}

    def handback(self, recipe: Recipe, steps: int, *, gpu_profile: str | None = None) -> Handback:
        """``recipe`` as a TRL launch of the full run's ``steps`` (tunekit steps: generation batches):
        ``trl_launch.py`` and the line that runs it."""
        gpu = on_gpu(recipe.system.device)
        serve = serve_line(recipe)
        script = launch_script(recipe, gpu=gpu, steps=steps, serve=serve)
        if serve is None:
            return Handback(command=launcher_line(recipe, gpu), files={LAUNCH_FILE: script})
        # the server in the background, its log beside the script (TRL's client waits for it, up to
        # vllm_server_timeout), stopped when the subshell ends however it ends (training done, Ctrl-C, SIGTERM: a
        # background job ignores the terminal's SIGINT); the line's status is training's
        stop = "trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM"
        return Handback(command=f"( {serve} > {SERVE_LOG} 2>&1 & server=$!; {stop}; {launcher_line(recipe, gpu)} )",
                        files={LAUNCH_FILE: script})


def refusals(recipe: Recipe, gpu: bool) -> list[str]:
    """Every knob of ``recipe`` TRL cannot express, as sentences naming the key (empty: it runs); the first is the
    one :meth:`TrlRunner.check` refuses with."""
    return (_trainer_refusals(recipe) + _loss_refusals(recipe) + _placement_refusals(recipe)
            + _engine_refusals(recipe) + _probe_refusals(recipe, gpu) + _batch_refusals(recipe, gpu))


def _trainer_refusals(recipe: Recipe) -> list[str]:
    """What TRL's trainer is: GRPO, every rank under one launcher on one node, rewards from task.reward only."""
    a, s = recipe.algorithm, recipe.system
    out = []
    if a.name != "grpo":
        out.append(f"algorithm.name={a.name}: the installed TRL ships no maintained PPO trainer (GRPOTrainer is its "
                   "on-policy trainer); set algorithm.name=grpo or use runner builtin.")
    if s.controller != "spmd":
        out.append("system.controller=single: TRL runs every rank through one launcher (torchrun/accelerate) and has "
                   "no single-controller mode; set system.controller=spmd or use runner builtin.")
    if s.nnodes > 1:
        out.append(f"system.nnodes={s.nnodes}: runner trl launches its ranks on one node; set system.nnodes=1 or use "
                   "runner builtin.")
    if recipe.model.reward_model_path:
        out.append("model.reward_model_path: runner trl scores with task.reward only; unset it or use runner builtin.")
    return out


def _loss_refusals(recipe: Recipe) -> list[str]:
    """GRPO's loss as TRL writes it: a k3 KL term in the loss, a two-sided clip above 1 + clip_ratio_high."""
    a = recipe.algorithm
    out = []
    if a.kl_in_reward:
        out.append("algorithm.kl_loss=false: TRL's GRPO puts the KL in the loss only (beta), never in the reward; "
                   "set algorithm.kl_loss=true or use runner builtin.")
    elif a.uses_ref and a.kl_kind != "k3":
        out.append(f"algorithm.kl_estimator={a.kl_kind}: TRL's GRPO KL term is the k3 estimator; "
                   "set algorithm.kl_estimator=k3 (or leave it unset).")
    if a.clip_ratio_c <= 1 + a.clip_high:
        out.append(f"algorithm.clip_ratio_c={a.clip_ratio_c:g}: TRL's two-sided clip (delta) caps the ratio only above "
                   f"1 + clip_ratio_high = {1 + a.clip_high:g}; set clip_ratio_c above it.")
    return out


def _placement_refusals(recipe: Recipe) -> list[str]:
    """Which GPUs hold what: the trainer's roles (and an in-process engine) together, a vLLM server's elsewhere."""
    s, rc = recipe.system, recipe.system.rollout
    trainer = {r: tuple(sorted(s.device_map.get(r) or [])) for r in ("actor", "ref", "reward")
               if r != "ref" or recipe.algorithm.uses_ref}
    rollout = tuple(sorted(s.device_map.get("rollout") or []))
    out = []
    if len(set(trainer.values())) > 1 or (backend_of(rc).in_trainer_ranks and rollout != trainer["actor"]):
        out.append("system.device_map: TRL colocates policy, reference, reward and (in-process) rollout on the same "
                   "GPUs; give them the same list, or use backend vllm_server for rollout GPUs of their own.")
    if rc.backend == "vllm_server" and rollout and set(rollout) & set(trainer["actor"]):
        out.append("system.device_map.rollout: TRL's vLLM server receives weights over NCCL, which cannot link two "
                   "processes on one GPU; give the rollout GPUs the actor does not hold.")
    return out


def _engine_refusals(recipe: Recipe) -> list[str]:
    """TRL's vLLM engine: colocated, it runs vLLM's default and sleeps at level 2; it takes no scheduler knobs."""
    rc = recipe.system.rollout
    out = []
    if rc.backend == "vllm" and (rc.enforce_eager or not rc.torch_compile):
        out.append("system.rollout.enforce_eager / torch_compile: TRL's colocated engine always runs vLLM's default "
                   "(CUDA graphs with torch.compile); set system.rollout.enforce_eager=false and "
                   "system.rollout.torch_compile=true.")
    if rc.backend == "vllm" and rc.enable_sleep and rc.sleep_level != 2:
        out.append("system.rollout.sleep_level=1: TRL's colocated engine sleeps at level 2 (weights dropped and "
                   "re-pushed); set system.rollout.sleep_level=2.")
    if not backend_of(rc).generates_with_policy and (knobs := engine_knobs(rc)):
        out.append(f"system.rollout.{next(iter(knobs))}: TRL builds its vLLM engine with its own scheduler settings "
                   "and takes none of max_num_seqs, max_num_batched_tokens, enable_prefix_caching, "
                   "enable_chunked_prefill; unset them or use runner builtin.")
    if not backend_of(rc).generates_with_policy and rc.logprobs is False:
        out.append("system.rollout.logprobs=false: TRL builds its engine's sampling parameters itself and asks for "
                   "the sampled tokens' logprobs; set system.rollout.logprobs=auto or use runner builtin.")
    return out


def _probe_refusals(recipe: Recipe, gpu: bool) -> list[str]:
    """What a probe asks beyond the trainer: offload (under FSDP, GPUs only), traces, several ranks (GPUs only)."""
    out = []
    if recipe.system.memory.param_offload and not uses_fsdp(recipe, gpu):
        out.append("system.memory.param_offload: TRL offloads only under FSDP, which it runs on GPUs only; "
                   "set system.memory.param_offload=false on CPU.")
    if recipe.system.memory.master_weights is True and not uses_fsdp(recipe, gpu):
        out.append("system.memory.master_weights=true: TRL keeps the plain module's fp32 weights under bf16 autocast "
                   "and no bf16 copy beside them; set system.memory.master_weights=auto or use runner builtin.")
    if recipe.system.cuda_graphs is True:
        out.append("system.cuda_graphs=true: TRL's torch_compile compiles in torch's default mode, without CUDA "
                   "graphs; set system.cuda_graphs=false or use runner builtin.")
    if recipe.profiler.trace:
        out.append("profiler.trace: runner trl saves no torch.profiler traces (TRL's steps are timed, not traced); "
                   "set profiler.trace=false or use runner builtin.")
    if recipe.probe.save_policy:
        out.append("probe.save_policy: runner trl saves through TRL's own save_strategy (its handed-back script keeps "
                   "TRL's checkpoints in trl-out/); set probe.save_policy=false or use runner builtin.")
    if not gpu and len(recipe.system.devices) > 1:
        out.append("system.device_map: runner trl runs several ranks on GPUs only; on CPU give every role [0].")
    return out


def _batch_refusals(recipe: Recipe, gpu: bool) -> list[str]:
    """Batch sizes TRL cannot split: its per-device batch times the ranks must divide the mini-batch and step batch."""
    b, n = recipe.system.batch, ranks(recipe, gpu)
    if b.mini_batch % (b.micro_batch * n) or b.samples_per_step % (b.micro_batch * n):
        return [f"system.batch.micro_batch_size {b.micro_batch_size}: TRL's per-device batch x {n} rank(s) must "
                f"divide the mini-batch ({b.mini_batch}) and the step batch ({b.samples_per_step}); change one."]
    return []


def launcher_line(recipe: Recipe, gpu: bool) -> str:
    """How the launch script is started: ``accelerate launch`` on several GPUs or under FSDP, else python."""
    n = ranks(recipe, gpu)
    distributed = n > 1 or uses_fsdp(recipe, gpu)
    line = f"accelerate launch --num_processes {n} {LAUNCH_FILE}" if distributed else f"python {LAUNCH_FILE}"
    return f"CUDA_VISIBLE_DEVICES={visible_devices(trainer_devices(recipe.system))} {line}" if gpu else line


SERVE_LOG = "trl-vllm-serve.log"
"""Where the handed-back command of a ``vllm_server`` run writes the server's output."""


def _model_and_context(recipe: Recipe) -> tuple[str | None, int]:
    """The checkpoint a handed-back run loads (None: a shape preset's, the user's own) and the engine's context as
    the probes had it (else vLLM reserves its cache for the model's longest); ``recipe`` with its model resolved."""
    from tunekit.trainer.rollout.checkpoint import max_model_len

    m = recipe.model
    if m.path or m.preset:
        model = m.path
    else:
        from tunekit.workload.models import EMBEDDED_MODEL_DIR

        model = str(EMBEDDED_MODEL_DIR)
    return model, max_model_len(Path(model) if model else None, recipe.task.max_new_tokens)


def serve_line(recipe: Recipe) -> str | None:
    """``trl vllm-serve`` on the rollout GPUs as the probes started it, for a ``vllm_server`` rollout without a
    ``server_url``; None otherwise. A converted model (a pretrained preset, a ``.gguf`` file) is found, or converted,
    where the line runs (``python -m tunekit.workload.pretrained``)."""
    from tunekit.workload.pretrained import converts, resolve_model

    s, m = recipe.system, recipe.model
    if s.rollout.backend != "vllm_server" or s.rollout.server_url:
        return None
    resolved = resolve_model(recipe)
    model, context = _model_and_context(resolved)
    if converts(m):
        which = ["--preset", m.preset] if m.preset else ["--path", str(m.path)]
        found = f'"$({shlex.join(["python", "-m", "tunekit.workload.pretrained", *which])})"'
    else:
        found = shlex.quote(model or f"<your {m.preset} checkpoint directory>")
    rest = shlex.join(["--max-model-len", str(context), *server_args(resolved)])
    return f"CUDA_VISIBLE_DEVICES={','.join(map(str, s.device_map.get('rollout') or []))} trl vllm-serve --model {found} {rest}"


def launch_script(recipe: Recipe, *, gpu: bool, steps: int, serve: str | None) -> str:
    """A Python script that runs ``recipe`` with TRL's GRPOTrainer for ``steps`` probe steps (``--steps N`` sets
    another length); its docstring gives the line that launches it (with ``serve``, :func:`serve_line`, started
    first). The prompts and the reward are tunekit's
    workload, as every probe had them (:func:`tunekit.runners.trl_entry.grpo_workload`), through the same chat
    template; a converted model (a pretrained preset, a ``.gguf`` file) is found where the script runs (converted
    there first if that machine's cache lacks it)."""
    from tunekit.runners.trl_entry import eval_args
    from tunekit.workload import held_out_count
    from tunekit.workload.pretrained import converts, resolve_model

    source = recipe.model if converts(recipe.model) else None  # what the script converts where it runs
    recipe = resolve_model(recipe)
    args = grpo_args(recipe, gpu=gpu) | {"output_dir": "trl-out", "shuffle_dataset": False}
    t, m, s, p = recipe.task, recipe.model, recipe.system, recipe.probe
    evaluates = recipe.evaluates
    if evaluates:  # the probes' evaluation: greedy answers to the same held-out prompts as often
        args |= eval_args(recipe, optimizer_steps_per_step(recipe), held_out_count(t, p.eval_prompts))
    model, context = _model_and_context(recipe)
    if s.rollout.backend == "vllm":
        args["vllm_max_model_length"] = context
    lines = ['"""GRPO with TRL: the configuration tunekit found, as TRL arguments.', "",
             f"Launch (--steps N: the run's length in generation batches, default {steps}):", f"    {launcher_line(recipe, gpu)}"]
    if serve is not None:
        lines += ["", "with the vLLM server on the rollout GPUs, started first:", f"    {serve}"]
    task = pprint.pformat(t.model_dump(mode="json"), indent=4, sort_dicts=False)
    model_arg = (f"parser.add_argument('--model', default={model!r}, help='the checkpoint directory')" if model else
                 f"parser.add_argument('--model', required=True, help='your {m.preset} checkpoint directory')")
    if source is not None:
        what = f"the {source.preset} preset" if source.preset else source.path
        model_arg = "\n".join([f"parser.add_argument('--model', help='the checkpoint directory (default: {what}, converted "
                               "by tunekit where this runs, once)')",
                               "cli = parser.parse_args()",
                               "if cli.model is None:",
                               "    from tunekit.config import ModelConfig",
                               "    from tunekit.workload.pretrained import checkpoint",
                               "",
                               f"    cli.model = str(checkpoint(ModelConfig.model_validate({source.model_dump(mode='json', exclude_defaults=True)!r})))"])
    if evaluates:
        before = ", and once before training" if p.eval_before_train else ""
        lines += ["", f"Every {p.eval_every} generation batches{before} it answers the {p.eval_prompts} held-out prompts (at most)",
                  "greedily, as the probes did: TRL's eval_reward (the mean of its evaluation batches' means)."]
    imports = (["from trl import GRPOConfig", "", "from tunekit.config import TaskConfig",
                "from tunekit.runners.trl_entry import greedy_eval_trainer, grpo_workload", "",
                "GRPOTrainer = greedy_eval_trainer()  # TRL's, its evaluation greedy"] if evaluates else
               ["from trl import GRPOConfig, GRPOTrainer", "", "from tunekit.config import TaskConfig",
                "from tunekit.runners.trl_entry import grpo_workload"])
    lines += ['"""', "", "import argparse", "", "from datasets import Dataset", "from transformers import AutoTokenizer",
              *imports, "",
              f"TASK = TaskConfig.model_validate(\n{task})",
              "", "parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])",
              f"parser.add_argument('--steps', type=int, default={steps}, help='generation batches to train')", model_arg,
              *([] if source is not None else ["cli = parser.parse_args()"]),
              f"tokenizer = AutoTokenizer.from_pretrained({m.tokenizer_path!r})" if m.tokenizer_path else
              "tokenizer = AutoTokenizer.from_pretrained(cli.model)",
              "# tunekit's prompts in step order (through the tokenizer's chat template, as task.chat_template says)",
              "# and task.reward, called as every probe called it",
              f"rows, reward = grpo_workload(TASK, per_step={s.batch.prompts_per_step}, steps=cli.steps, seed={p.seed},",
              f"                              tokenizer=tokenizer{f', eval_prompts={p.eval_prompts}' if evaluates else ''})",
              "args = GRPOConfig("] + [f"    {k}={v!r}," for k, v in args.items()]
    lines += [f"    max_steps=cli.steps * {optimizer_steps_per_step(recipe)},", ")"]
    if evaluates:  # the held-out rows follow the training rows
        lines += ["data, trained = Dataset.from_dict(rows), cli.steps * " + str(s.batch.prompts_per_step),
                  "trainer = GRPOTrainer(model=cli.model, reward_funcs=reward, args=args, train_dataset=data.select(range(trained)),",
                  "                      eval_dataset=data.select(range(trained, len(data))), processing_class=tokenizer)"]
        if p.eval_before_train:
            lines += ["# the untrained model's held-out reward, as the probes read it first (train() starts a new log)",
                      "print('before training:', trainer.evaluate(), flush=True)"]
    else:
        lines += ["trainer = GRPOTrainer(model=cli.model, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict(rows),",
                  "                      processing_class=tokenizer)"]
    lines += ["trainer.train()", ""]
    return "\n".join(lines)
