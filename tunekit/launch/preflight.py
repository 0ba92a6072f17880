"""Checks a recipe against this machine before anything is written or launched.

Each problem is one sentence naming the key and what to do (exit 2 via TunekitError).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tunekit import models
from tunekit.config import Recipe
from tunekit.dist import on_gpu
from tunekit.errors import ConfigError, NotImplementedKnob
from tunekit.runners import runner_for
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
    """Raise a TunekitError for the first problem found (the checks every runner shares, then the runner's own);
    nothing has been written yet."""
    check_model(recipe)
    check_workload(recipe.task)
    check_device_map(recipe, cuda_count)
    check_backends(recipe, cuda_count)
    runner_for(recipe).check(recipe, cuda_count)
    check_server(recipe)  # last: the only check that waits on the network
