"""Checks a recipe against this machine before anything is written or launched.

Each problem is one sentence naming the key and what to do (exit 2 via TunekitError).
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

from tunekit import models
from tunekit.config import Recipe
from tunekit.dist import on_gpu
from tunekit.errors import ConfigError, NotImplementedKnob
from tunekit.workload import check_workload


def check_model(recipe: Recipe) -> None:
    m = recipe.model
    if m.preset and m.preset not in models.PRESETS:
        raise ConfigError(f"model.preset {m.preset!r} is not a preset; choose one of: {', '.join(sorted(models.PRESETS))}.")
    for key, path in (("model.path", m.path), ("model.tokenizer_path", m.tokenizer_path), ("model.reward_model_path", m.reward_model_path)):
        if path and not Path(path).is_dir():
            raise ConfigError(f"{key} {path!r} does not exist or is not a directory; give a local checkpoint directory.")


def check_device_map(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    dm = sysc.device_map
    for role in recipe.roles:
        if role == "rollout" and sysc.rollout.backend == "vllm_server" and dm.get(role) == []:
            if not sysc.rollout.server_url:
                raise ConfigError("system.device_map.rollout is [] (generation outside tunekit's GPUs) but system.rollout.server_url is not set; give the URL of a running vLLM server, or GPUs for tunekit to start one on.")
            continue
        if not dm.get(role):
            raise ConfigError(f"system.device_map.{role} is missing; {recipe.algorithm.name} needs devices for {', '.join(recipe.roles)}.")
    if on_gpu(recipe.system.device, cuda_count):
        bad = [i for i in sysc.devices if i >= cuda_count]
        if bad:
            raise ConfigError(f"system.device_map names GPU {bad[0]} but this machine has {cuda_count} GPU(s) (0..{cuda_count - 1}); fix the device map.")
    if sysc.controller == "spmd":
        # a vllm_server rollout is its own process tree, on its own GPUs or the trainer's
        split = {"rollout"} if sysc.rollout.backend == "vllm_server" else set()
        groups = {tuple(sorted(dm[r])) for r in recipe.roles if dm.get(r) and r not in split}
        if len(groups) > 1:
            raise ConfigError("system.device_map: controller spmd colocates every role on the same devices; give every role the same list, or set system.controller=single to split roles.")


def check_batch(recipe: Recipe) -> None:
    b, world = recipe.system.batch, recipe.system.trainer_world_size
    if recipe.system.controller != "spmd" or world == 1:
        return
    if b.prompts_per_step % world:
        raise ConfigError(f"system.batch.prompts_per_step {b.prompts_per_step} does not divide over {world} ranks; use a multiple of {world}.")
    if b.mini_batch % world or (b.mini_batch // world) % min(b.micro_batch, b.mini_batch // world):
        raise ConfigError(f"system.batch.mini_batch_size {b.mini_batch} must split into {world} equal rank shares that micro_batch_size {b.micro_batch_size} divides; change one of them.")


def check_groups(recipe: Recipe) -> None:
    """controller single: each role group splits the step's batch (and the actor/critic mini-batch) evenly."""
    sysc, b = recipe.system, recipe.system.batch
    if sysc.controller != "single":
        return
    for role in recipe.roles:
        n = len(sysc.device_map.get(role) or [])
        if n and b.samples_per_step % n:
            raise ConfigError(f"system.device_map.{role} has {n} devices, which does not divide the step's {b.samples_per_step} samples (prompts_per_step x samples_per_prompt); use a divisor or change the batch.")
        if n and role in ("actor", "critic") and b.mini_batch % (n * min(b.micro_batch, b.mini_batch // n)):
            raise ConfigError(f"system.batch.mini_batch_size {b.mini_batch} must be a multiple of the {role} group's {n} devices x micro_batch_size = {n * b.micro_batch}; change one of them.")


def check_weight_sync(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    if sysc.controller != "single" or sysc.weight_sync != "collective":
        return
    rollout, actor = sysc.device_map.get("rollout") or [], sysc.device_map.get("actor") or [0]
    if not rollout:
        raise ConfigError("system.weight_sync=collective needs a rollout worker group, and system.device_map.rollout is empty (a vLLM server gets weights over HTTP); use weight_sync=object_store.")
    if on_gpu(recipe.system.device, cuda_count) and actor[0] in rollout:
        raise ConfigError(f"system.weight_sync=collective: NCCL cannot broadcast between two processes on one GPU, and actor rank 0 shares GPU {actor[0]} with a rollout worker; use weight_sync=object_store or put the rollout on other GPUs.")


def check_ray_address(address: str | None, timeout_s: float = 5.0) -> None:
    """A Ray head that does not accept connections fails here, before a probe is launched.

    Ray itself retries an unreachable address for minutes; the driver bounds the full
    handshake with ``system.ray_timeout_s``.
    """
    if not address or address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"system.ray_address {address!r} is not host:port; give the Ray head's address, e.g. 10.0.0.1:6379, or unset it for a local cluster.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"system.ray_address {address}: nothing answers there ({e.strerror or e}); start the cluster (`ray start --head`), fix the address, or unset it for a local cluster.") from None


def check_backends(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    if sysc.memory.optimizer_offload and not sysc.memory.param_offload:
        raise NotImplementedKnob("system.memory.optimizer_offload without param_offload is not supported: FSDP2 offloads optimizer state with the parameters; set system.memory.param_offload=true too.")
    # a server at server_url needs neither vLLM nor a GPU here (weights then cannot be pushed: staleness is recorded)
    external = sysc.rollout.backend == "vllm_server" and sysc.rollout.server_url
    if sysc.rollout.backend in ("vllm", "vllm_server") and not external:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"system.rollout.backend={sysc.rollout.backend} needs vLLM, which is not installed; run `pip install -e \".[vllm]\"` on a GPU machine or use backend hf.")
        if not on_gpu(recipe.system.device, cuda_count):
            raise ConfigError(f"system.rollout.backend={sysc.rollout.backend} needs an NVIDIA GPU and this probe runs on CPU; use backend hf on CPU.")
    if sysc.controller == "single" and importlib.util.find_spec("ray") is None:
        raise ConfigError("system.controller=single needs Ray, which is not installed; run `pip install -e \".[ray]\"` or use controller spmd.")
    if sysc.controller == "single":
        check_ray_address(sysc.ray_address)


def check_server(recipe: Recipe, timeout_s: float = 5.0) -> None:
    """A vllm_server rollout at server_url: the server must answer now."""
    rc = recipe.system.rollout
    if rc.backend != "vllm_server" or not rc.server_url:
        return
    from tunekit.trainer.rollout.server_process import health_problem

    problem = health_problem(rc.server_url, timeout_s=timeout_s)
    if problem:
        raise ConfigError(f"system.rollout.server_url {rc.server_url} does not answer {rc.server_url}/health ({problem}); start the vLLM server or fix the URL.")


def preflight(recipe: Recipe, cuda_count: int) -> None:
    """Raise a TunekitError for the first problem found; nothing has been written yet."""
    check_model(recipe)
    check_workload(recipe.task)
    check_device_map(recipe, cuda_count)
    check_batch(recipe)
    check_groups(recipe)
    check_weight_sync(recipe, cuda_count)
    check_backends(recipe, cuda_count)
    check_server(recipe)  # last: the only check that waits on the network
