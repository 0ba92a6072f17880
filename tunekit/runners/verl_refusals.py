"""What the ``verl`` runner refuses before anything starts: every knob verl cannot express (:func:`refusals`, one
sentence naming the key each), a trl that verl's model patching would fail to import (:func:`trl_conflict`) and a
module verl's trainer imports that verl's own requirements do not bring (:func:`missing_companion`)."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
from pathlib import Path

from tunekit.config import Recipe
from tunekit.trainer.faults import FAULT_ENV, fault_for


def gpus(recipe: Recipe) -> int:
    """GPUs verl's roles share: every GPU the device map names."""
    return max(1, len(recipe.system.devices))



COMPANIONS = {"transfer_queue": "TransferQueue", "orjson": "orjson"}
"""Modules verl 0.9's trainer imports as it starts (``TaskRunnerV1.run``: ``import transfer_queue``; its step
logger, ``verl/utils/tracking.py``: ``import orjson``) that verl's own requirements do not bring (TransferQueue is in
its ``verl-core`` extra), by module and the package that installs it (in tunekit's ``verl`` extra)."""


def missing_companion() -> str | None:
    """One sentence when a module of :data:`COMPANIONS` is not importable here, else None: without it verl's trainer
    fails inside its first Ray actor, after Ray and verl's start-up have run."""
    for module, package in COMPANIONS.items():
        if importlib.util.find_spec(module) is None:
            return (f"runner verl: verl's trainer imports {module} (the {package} package, which verl's own "
                    f"requirements do not bring) and it is not installed; run `pip install -e \".[verl]\"`, which "
                    "brings it.")
    return None


VALUE_HEAD = "AutoModelForCausalLMWithValueHead"
"""trl's class verl's model patching imports whenever trl is importable (trl 1.13 and later no longer have it)."""
LAST_TRL_WITH_VALUE_HEAD = "1.12"


def trl_conflict() -> str | None:
    """One sentence when the trl importable here (what verl's workers import) lacks :data:`VALUE_HEAD` both where
    verl looks first, ``trl.experimental.ppo``, and at trl's top level; None without trl or with a trl that has it.
    Reads trl's package files, importing nothing."""
    spec = importlib.machinery.PathFinder.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for init in (root / "experimental" / "ppo" / "__init__.py", root / "__init__.py"):
        if init.is_file() and VALUE_HEAD in init.read_text(errors="replace"):
            return None
    try:
        trl_version = f"trl {importlib.metadata.version('trl')}"
    except importlib.metadata.PackageNotFoundError:
        trl_version = f"the trl in {root}"
    try:
        verl_version = f"verl {importlib.metadata.version('verl')}"
    except importlib.metadata.PackageNotFoundError:
        verl_version = "verl"
    return (f"runner verl: {verl_version} imports trl's {VALUE_HEAD}, which {trl_version} no longer has; run the verl "
            f"runner in an environment with trl<={LAST_TRL_WITH_VALUE_HEAD} or without trl (the TRL runner's trl 1.16 "
            f"needs an environment of its own).")



def refusals(recipe: Recipe, gpu: bool) -> list[str]:
    """Every knob of ``recipe`` verl cannot express, as sentences naming the key (empty: it runs); the first is the
    one :meth:`VerlRunner.check` refuses with."""
    return (_layout_refusals(recipe, gpu) + _learning_refusals(recipe) + _execution_refusals(recipe)
            + _tooling_refusals(recipe) + _batch_refusals(recipe))


def _layout_refusals(recipe: Recipe, gpu: bool) -> list[str]:
    """Where verl runs: NVIDIA GPUs, one Ray driver on one node, every role and its vLLM engine on the same GPUs."""
    s, rc = recipe.system, recipe.system.rollout
    out = []
    if not gpu:
        out.append("system.device: runner verl trains on NVIDIA GPUs only and this probe runs on CPU; run it on a GPU "
                   "machine or use runner builtin.")
    if s.controller != "single":
        out.append("system.controller=spmd: verl is a single controller (a Ray driver dispatching to worker groups) "
                   "and has no SPMD mode; set system.controller=single.")
    if rc.backend != "vllm":
        out.append(f"system.rollout.backend={rc.backend}: runner verl generates with verl's vLLM engine colocated "
                   "with the actor; set system.rollout.backend=vllm.")
    if len({tuple(sorted(s.device_map.get(r) or [])) for r in recipe.roles}) > 1:
        out.append("system.device_map: runner verl colocates every role on the same GPUs (verl's hybrid engine); "
                   "give every role the same list.")
    if s.weight_sync != "object_store":
        out.append("system.weight_sync=collective: verl syncs the colocated engine's weights itself; "
                   "set system.weight_sync=object_store (or leave it unset).")
    if s.ray_address:
        out.append("system.ray_address: runner verl starts its own local Ray cluster; unset it.")
    if s.nnodes > 1:
        out.append(f"system.nnodes={s.nnodes}: runner verl starts its Ray cluster on one node; set system.nnodes=1 or "
                   "use runner builtin.")
    return out


def _learning_refusals(recipe: Recipe) -> list[str]:
    """What verl fixes about learning: rewards from task.reward only, bf16 mixed precision, GAE advantages whitened."""
    out = []
    if recipe.model.reward_model_path:
        out.append("model.reward_model_path: runner verl scores with task.reward only; unset it or use runner builtin.")
    if recipe.model.dtype == "float32":
        out.append("model.dtype=float32: verl trains under bf16 mixed precision and generates in bf16; "
                   "set model.dtype=auto or bfloat16.")
    if recipe.algorithm.name == "ppo" and not recipe.algorithm.whiten_advantages:
        out.append("algorithm.whiten_advantages=false: verl always whitens GAE advantages; "
                   "set algorithm.whiten_advantages=true or use runner builtin.")
    return out


def _execution_refusals(recipe: Recipe) -> list[str]:
    """How verl runs its engine and actor: the engine sleeps at level 2 and compiles under CUDA graphs; the actor
    under FSDP, eager, always."""
    rc = recipe.system.rollout
    out = []
    if rc.enable_sleep and rc.sleep_level != 2:
        out.append("system.rollout.sleep_level=1: verl's colocated engine sleeps at level 2 (weights dropped and "
                   "synced again); set system.rollout.sleep_level=2.")
    if not rc.enforce_eager and not rc.torch_compile:
        out.append("system.rollout.torch_compile=false: verl's engine with CUDA graphs runs vLLM's default "
                   "(torch.compile + piecewise graphs); set system.rollout.torch_compile=true or "
                   "system.rollout.enforce_eager=true.")
    if recipe.system.memory.fsdp_single_gpu is False:
        out.append("system.memory.fsdp_single_gpu=false: verl always trains under FSDP; "
                   "set system.memory.fsdp_single_gpu=true.")
    if recipe.system.compile is True:
        out.append("system.compile=true: verl 0.9's FSDP engine trains the model eager (its use_torch_compile "
                   "compiles only the entropy function); set system.compile=auto or false, or use runner builtin.")
    return out


def _tooling_refusals(recipe: Recipe) -> list[str]:
    """What tunekit's own probes add that runner verl does not: torch.profiler traces and injected faults."""
    out = []
    if recipe.profiler.trace:
        out.append("profiler.trace: runner verl saves no torch.profiler traces through tunekit; "
                   "set profiler.trace=false or use runner builtin.")
    if (fault := fault_for(recipe)) != "none":
        out.append(f"{FAULT_ENV}={fault}: runner verl injects no faults; unset {FAULT_ENV} for this probe.")
    if recipe.probe.save_policy:
        out.append("probe.save_policy: runner verl saves through its own trainer.save_freq (its handed-back full run "
                   "saves its last step); set probe.save_policy=false or use runner builtin.")
    return out


def _batch_refusals(recipe: Recipe) -> list[str]:
    """Batch sizes verl cannot split: mini-batches counted in prompts, batches split evenly over the GPUs."""
    b, n = recipe.system.batch, gpus(recipe)
    out = []
    if b.mini_batch % b.samples_per_prompt:
        out.append(f"system.batch.mini_batch_size {b.mini_batch}: verl counts mini-batches in prompts, so it must be "
                   f"a multiple of samples_per_prompt {b.samples_per_prompt}; change one of them.")
    if b.samples_per_step % n or b.mini_batch % (n * b.micro_batch):
        out.append(f"system.batch.micro_batch_size {b.micro_batch_size}: verl splits the step batch "
                   f"({b.samples_per_step}) and each mini-batch ({b.mini_batch}) evenly over {n} GPU(s) in "
                   "micro-batches of this size; change one of them.")
    return out
