"""Checks a recipe against this machine before anything is written or launched.

Each problem is one sentence naming the key and what to do (exit 2 via TunekitError).
"""

from __future__ import annotations

import functools
from pathlib import Path

from tunekit.workload import models
from tunekit.config import ModelConfig, Recipe, TaskConfig
from tunekit.placement.gpus import on_gpu
from tunekit.config.errors import ConfigError
from tunekit.placement.nodes import check_nodes
from tunekit.workload.pretrained import PRETRAINED
from tunekit.runners import runner_for
from tunekit.placement.backends import backend_of
from tunekit.trainer.rollout import engine_of
from tunekit.workload import check_workload


def check_model(recipe: Recipe) -> None:
    m = recipe.model
    if m.preset and m.preset not in models.PRESETS and m.preset not in PRETRAINED:
        names = ", ".join(sorted([*models.PRESETS, *PRETRAINED]))
        raise ConfigError(f"model.preset {m.preset!r} is not a preset; choose one of: {names}.")
    for key, path in (("model.path", m.path), ("model.tokenizer_path", m.tokenizer_path), ("model.reward_model_path", m.reward_model_path)):
        if path and not Path(path).is_dir():
            raise ConfigError(f"{key} {path!r} does not exist or is not a directory; give a local checkpoint directory.")


def tokenizer_name(recipe: Recipe) -> str:
    """The probe's tokenizer as an error sentence names it."""
    m = recipe.model
    if m.tokenizer_path or m.path:
        key = "model.tokenizer_path" if m.tokenizer_path else "model.path"
        return f"the tokenizer of {key} {m.tokenizer_path or m.path!r}"
    return "the embedded character tokenizer"


def tokenizer_of(recipe: Recipe):
    """The tokenizer a probe loads; a ConfigError naming the key when it does not load."""
    from tunekit.trainer.build import load_tokenizer

    try:
        return load_tokenizer(recipe)
    except ValueError as e:
        raise ConfigError(f"{tokenizer_name(recipe)} does not load ({e}); point model.tokenizer_path at a "
                          "directory with tokenizer files.") from None


def check_task(recipe: Recipe) -> None:
    """The workload (:func:`tunekit.workload.check_workload`) against the tokenizer the probe loads; once per
    workload, model and dataset file version in this process (a search's trials share it)."""
    stamp = tuple(_file_stamp(p) for p in (recipe.task.dataset, recipe.task.eval_dataset))
    _check_task_once(recipe.task.model_dump_json(), recipe.model.model_dump_json(), stamp)


def _file_stamp(path: str | None) -> tuple[int, int] | None:
    """A dataset file's version (modification time, size), or None for no file."""
    p = Path(path) if path else None
    return (p.stat().st_mtime_ns, p.stat().st_size) if p is not None and p.is_file() else None


@functools.lru_cache(maxsize=8)
def _check_task_once(task_json: str, model_json: str, stamp: tuple) -> None:
    # only the task and the model matter here: the recipe around them was validated whole already
    recipe = Recipe.model_construct(task=TaskConfig.model_validate_json(task_json),
                                    model=ModelConfig.model_validate_json(model_json))
    check_workload(recipe.task, tokenizer_of(recipe), tokenizer_name(recipe))


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


def heads_problem(tp: int, heads: int, kv_heads: int) -> str | None:
    """Why a model of ``heads`` attention heads and ``kv_heads`` key/value heads cannot be split over ``tp`` GPUs
    (vLLM's rule: the attention heads divide evenly; key/value heads divide evenly, or, fewer than TP, are
    replicated and must divide TP), or None."""
    if heads % tp:
        return f"its {heads} attention heads do not split evenly over {tp} GPUs"
    if kv_heads % tp if kv_heads >= tp else tp % kv_heads:
        return f"its {kv_heads} key/value heads neither split evenly over {tp} GPUs nor divide {tp}"
    return None


def check_rollout_parallel(recipe: Recipe, cuda_count: int) -> None:
    """A tensor-parallel rollout engine fits this machine's GPUs and the model's attention heads."""
    tp = recipe.system.rollout.tensor_parallel_size
    if tp == 1:
        return
    if on_gpu(recipe.system.device, cuda_count) and tp > cuda_count:
        raise ConfigError(f"system.rollout.tensor_parallel_size {tp} is more than this machine's {cuda_count} GPU(s); lower it to at most {cuda_count}.")
    m = recipe.model
    why = heads_problem(tp, *models.attention_heads(m.path, m.preset, m.trust_remote_code))
    if why:
        raise ConfigError(f"system.rollout.tensor_parallel_size {tp}: {why} ({m.preset or m.path or 'the embedded model'}); choose a size that divides them.")


def check_offload(recipe: Recipe, cuda_count: int) -> None:
    """Parameter offload parks FSDP2's shards in host memory between uses of a GPU: on CPU there is nothing to offload from."""
    if recipe.system.memory.param_offload and not on_gpu(recipe.system.device, cuda_count):
        raise ConfigError("system.memory.param_offload is true but the probe runs on CPU, where parameters already live in "
                          "host memory; set it to false, or run on a GPU.")


def preflight(recipe: Recipe, cuda_count: int) -> None:
    """Raise a TunekitError for the first problem found (the checks every runner shares, then the runner's own);
    nothing has been written yet."""
    check_model(recipe)
    check_task(recipe)
    check_device_map(recipe, cuda_count)
    check_offload(recipe, cuda_count)
    check_rollout_parallel(recipe, cuda_count)
    check_nodes(recipe)
    runner_for(recipe).check(recipe, cuda_count)
    engine_of(recipe.system.rollout).preflight(recipe, cuda_count)  # last: a server's may wait on the network
