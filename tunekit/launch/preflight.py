"""Checks a recipe against this machine before anything is written or launched.

Each problem is one sentence naming the key and what to do (exit 2 via TunekitError).
"""

from __future__ import annotations

from pathlib import Path

from tunekit import models
from tunekit.config import Recipe
from tunekit.dist import on_gpu
from tunekit.errors import ConfigError
from tunekit.runners import runner_for
from tunekit.trainer.rollout import backend_of
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
        if role == "rollout" and backend_of(sysc.rollout).served_by_url and dm.get(role) == []:
            if not sysc.rollout.server_url:
                raise ConfigError("system.device_map.rollout is [] (generation outside tunekit's GPUs) but system.rollout.server_url is not set; give the URL of a running vLLM server, or GPUs for tunekit to start one on.")
            continue
        if not dm.get(role):
            raise ConfigError(f"system.device_map.{role} is missing; {recipe.algorithm.name} needs devices for {', '.join(recipe.roles)}.")
    if on_gpu(recipe.system.device, cuda_count):
        bad = [i for i in sysc.devices if i >= cuda_count]
        if bad:
            raise ConfigError(f"system.device_map names GPU {bad[0]} but this machine has {cuda_count} GPU(s) (0..{cuda_count - 1}); fix the device map.")


def preflight(recipe: Recipe, cuda_count: int) -> None:
    """Raise a TunekitError for the first problem found (the checks every runner shares, then the runner's own);
    nothing has been written yet."""
    check_model(recipe)
    check_workload(recipe.task)
    check_device_map(recipe, cuda_count)
    runner_for(recipe).check(recipe, cuda_count)
    backend_of(recipe.system.rollout).check(recipe, cuda_count)  # last: a server's may wait on the network
