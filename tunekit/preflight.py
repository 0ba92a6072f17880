"""Checks a recipe against this machine before anything is written or launched.

Each problem is one sentence naming the key and what to do (exit 2 via TunekitError).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tunekit import models
from tunekit.config import Recipe
from tunekit.errors import ConfigError, NotImplementedKnob
from tunekit.tasks import TASKS


def needed_roles(recipe: Recipe) -> list[str]:
    roles = ["actor", "ref", "rollout", "reward"]
    return roles + (["critic"] if recipe.algorithm.uses_critic else [])


def uses_cuda(recipe: Recipe, cuda_count: int) -> bool:
    return recipe.system.device == "cuda" or (recipe.system.device == "auto" and cuda_count > 0)


def check_model(recipe: Recipe) -> None:
    m = recipe.model
    if m.preset and m.preset not in models.PRESETS:
        raise ConfigError(f"model.preset {m.preset!r} is not a preset; choose one of: {', '.join(sorted(models.PRESETS))}.")
    for key, path in (("model.path", m.path), ("model.tokenizer_path", m.tokenizer_path), ("model.reward_model_path", m.reward_model_path)):
        if path and not Path(path).is_dir():
            raise ConfigError(f"{key} {path!r} does not exist or is not a directory; give a local checkpoint directory.")
    if recipe.task.name not in TASKS:
        raise ConfigError(f"task.name {recipe.task.name!r} is not a task; choose one of: {', '.join(sorted(TASKS))}.")


def check_device_map(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    dm = sysc.device_map
    for role in needed_roles(recipe):
        if role == "rollout" and sysc.rollout.backend == "vllm_server" and dm.get(role) == []:
            continue
        if not dm.get(role):
            raise ConfigError(f"system.device_map.{role} is missing; {recipe.algorithm.name} needs devices for {', '.join(needed_roles(recipe))}.")
    if uses_cuda(recipe, cuda_count):
        bad = [i for i in sysc.devices if i >= cuda_count]
        if bad:
            raise ConfigError(f"system.device_map names GPU {bad[0]} but this machine has {cuda_count} GPU(s) (0..{cuda_count - 1}); fix the device map.")
    if sysc.controller == "spmd":
        groups = {tuple(sorted(dm[r])) for r in needed_roles(recipe) if dm.get(r)}
        if len(groups) > 1:
            raise ConfigError("system.device_map: controller spmd colocates every role on the same devices; give every role the same list, or set system.controller=single to split roles.")


def check_batch(recipe: Recipe) -> None:
    b, world = recipe.system.batch, recipe.system.world_size
    if recipe.system.controller != "spmd" or world == 1:
        return
    if b.prompts_per_step % world:
        raise ConfigError(f"system.batch.prompts_per_step {b.prompts_per_step} does not divide over {world} ranks; use a multiple of {world}.")
    if b.mini_batch % (world * b.micro_batch_size):
        raise ConfigError(f"system.batch.mini_batch_size {b.mini_batch} must be a multiple of ranks x micro_batch_size = {world * b.micro_batch_size}; change one of them.")


def check_backends(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    if sysc.memory.optimizer_offload and not sysc.memory.param_offload:
        raise NotImplementedKnob("system.memory.optimizer_offload without param_offload is not supported: FSDP2 offloads optimizer state with the parameters; set system.memory.param_offload=true too.")
    if sysc.rollout.backend in ("vllm", "vllm_server"):
        if importlib.util.find_spec("vllm") is None and not (sysc.rollout.backend == "vllm_server" and sysc.rollout.server_url):
            raise ConfigError(f"system.rollout.backend={sysc.rollout.backend} needs vLLM, which is not installed; run `pip install -e \".[vllm]\"` on a GPU machine or use backend hf.")
        if not uses_cuda(recipe, cuda_count):
            raise ConfigError(f"system.rollout.backend={sysc.rollout.backend} needs an NVIDIA GPU and this probe runs on CPU; use backend hf on CPU.")
    if sysc.controller == "single" and importlib.util.find_spec("ray") is None:
        raise ConfigError("system.controller=single needs Ray, which is not installed; run `pip install -e \".[ray]\"` or use controller spmd.")


def preflight(recipe: Recipe, cuda_count: int) -> None:
    """Raise a TunekitError for the first problem found; nothing has been written yet."""
    check_model(recipe)
    check_device_map(recipe, cuda_count)
    check_batch(recipe)
    check_backends(recipe, cuda_count)
