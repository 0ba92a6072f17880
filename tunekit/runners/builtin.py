"""The ``builtin`` runner: tunekit's own trainer (:mod:`tunekit.trainer`).

``system.controller`` picks the process tree: ``spmd`` is one rank per trainer GPU
(``tunekit.trainer.entry``, under torchrun for more than one), ``single`` is one driver
(``tunekit.trainer.driver``) dispatching to role worker groups on Ray. The checks here
are the ones those two shapes add to the shared preflight.
"""

from __future__ import annotations

import importlib.util
import shlex
import socket
import sys
from pathlib import Path

from tunekit.config import Recipe, dump_recipe
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.placement.gpus import on_gpu, visible_devices
from tunekit.placement.ports import free_port
from tunekit.rundir import compile_cache_dir
from tunekit.estimate.cold_start import graphs_key
from tunekit.estimate.traits import RunnerTraits
from tunekit.runners.base import (RECIPE_FILE, Handback, Runner, compile_cache_env, probe_env, shares_cache,
                                  warm_start_env)
from tunekit.placement.backends import backend_of, trainer_devices, trainer_world_size

TRAINED_ROLES = ("actor", "critic", "ref")
"""The roles whose models the trainer wraps (sharded or plain, compiled or not)."""


class BuiltinRunner(Runner):
    """tunekit's trainer, launched by torchrun (spmd) or as a Ray driver (single)."""

    name = "builtin"
    # its graphs mark the batch dimension dynamic; its engine wakes beside training's cached blocks unless its pool
    # would not fit beside them (tunekit.trainer.rollout.vllm_engine.must_empty_cache)
    traits = RunnerTraits(bf16_beside_masters=True, plain_ref_bf16=True, training_graphs=True,
                          engine_graphs_outside=True, wakes_beside_cache=True, graphs_any_batch=True)

    def check(self, recipe: Recipe, cuda_count: int) -> None:
        check_colocated(recipe)
        check_batch(recipe)
        check_groups(recipe)
        check_rollout_replicas(recipe)
        check_weight_sync(recipe, cuda_count)
        check_ray(recipe)

    def refusal(self, recipe: Recipe, *, gpu: bool) -> str | None:
        """:meth:`check`'s layout rules, on a machine with every GPU the device map names (Ray is not asked for)."""
        cuda = max(recipe.system.devices, default=0) + 1 if gpu else 0
        try:
            for rule in (check_colocated, check_batch, check_groups, check_rollout_replicas):
                rule(recipe)
            check_weight_sync(recipe, cuda)
        except TunekitError as e:
            return e.message
        return None

    def command(self, recipe: Recipe, run_dir: Path) -> list[str]:
        sysc = recipe.system
        if sysc.controller == "single":
            return [sys.executable, "-m", "tunekit.trainer.driver", str(run_dir)]
        if sysc.nnodes > 1:  # simulated nodes: one torchrun per node on this host (tunekit.placement.nodes)
            return [sys.executable, "-m", "tunekit.placement.nodes", str(run_dir)]
        ranks = trainer_world_size(sysc)
        if ranks == 1:
            return [sys.executable, "-m", "tunekit.trainer.entry", str(run_dir)]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "tunekit.trainer.entry", str(run_dir)]

    def env(self, recipe: Recipe, run_dir: Path | None, *, on_gpu: bool) -> dict[str, str]:
        env = probe_env(run_dir, on_gpu=on_gpu)
        if on_gpu and recipe.system.controller == "spmd":
            # each rank takes the GPU at its local rank; a rollout with GPUs of its own sets its own mask
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(trainer_devices(recipe.system), env)
        elif on_gpu and not recipe.system.ray_address:
            # a local Ray cluster then places the role groups on exactly the GPUs the device map names
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(recipe.system.devices, env)
        rc = recipe.system.rollout
        compiles = any(recipe.system.compiles(gpu=on_gpu, world=role_world(recipe, role))
                       for role in TRAINED_ROLES if role in recipe.roles)
        if run_dir is not None and (compiles or (on_gpu and backend_of(rc).needs_checkpoint(rc))):
            cache = compile_cache_dir(run_dir)
            env |= compile_cache_env(cache, env)
            if shares_cache(env):
                key = graphs_key(recipe, self.training_path(recipe, gpu=on_gpu), traits=self.traits)
                env |= warm_start_env(cache, key, env)
        return env

    def training_path(self, recipe: Recipe, *, gpu: bool) -> dict[str, bool]:
        """The actor's path (:meth:`MemoryConfig.shards`, :meth:`SystemConfig.compiles`,
        :meth:`MemoryConfig.keeps_masters`, :meth:`SystemConfig.captures` on its ranks)."""
        world, sysc = role_world(recipe, "actor"), recipe.system
        return {"resolved/fsdp": sysc.memory.shards(gpu=gpu, world=world),
                "resolved/compile": sysc.compiles(gpu=gpu, world=world),
                "resolved/master_weights": sysc.memory.keeps_masters(gpu=gpu, world=world),
                "resolved/cuda_graphs": sysc.captures(gpu=gpu, world=world),
                "resolved/old_logprob": recipe.recomputes_old_logprobs}

    def handback(self, recipe: Recipe, steps: int, *, gpu_profile: str | None = None) -> Handback:
        """``tunekit probe`` on the winner's resolved recipe for the full run's ``steps`` (``probe.timeout_s``
        still bounds it), priced with the search's profile so its cost reads against the answer's, and leaving the
        trained policy in its run directory (``probe.save_policy``)."""
        full = recipe.model_copy(update={"probe": recipe.probe.model_copy(update={"steps": steps, "save_policy": True})})
        priced = f" --gpu-profile {shlex.quote(gpu_profile)}" if gpu_profile else ""
        return Handback(command=f"tunekit probe --recipe {shlex.quote(RECIPE_FILE)} --steps {steps}{priced}",
                        files={RECIPE_FILE: dump_recipe(full)})


def role_world(recipe: Recipe, role: str) -> int:
    """Ranks a role's model runs on: every trainer rank under spmd, the role's own group under single."""
    sysc = recipe.system
    if sysc.controller == "spmd":
        return trainer_world_size(sysc)
    return max(1, len(sysc.device_map.get(role) or []))


def check_colocated(recipe: Recipe) -> None:
    """controller spmd: every rank runs every role, so every role in the ranks holds the same devices."""
    sysc, dm = recipe.system, recipe.system.device_map
    if sysc.controller != "spmd":
        return
    # a rollout that is a process tree of its own (a server) may sit on its own GPUs or the trainer's
    split = set() if backend_of(sysc.rollout).in_trainer_ranks else {"rollout"}
    groups = {tuple(sorted(dm[r])) for r in recipe.roles if dm.get(r) and r not in split}
    if len(groups) > 1:
        raise ConfigError("system.device_map: controller spmd colocates every role on the same devices; give every role the same list, or set system.controller=single to split roles.")


def check_batch(recipe: Recipe) -> None:
    """controller spmd: the step's prompts and each mini-batch split evenly over the ranks."""
    b, world = recipe.system.batch, trainer_world_size(recipe.system)
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
        rollout = role == "rollout"
        n = len(backend_of(sysc.rollout).rollout_workers(sysc) if rollout else sysc.device_map.get(role) or [])
        if n and b.samples_per_step % n:
            what = "rollout replicas (rollout GPUs / tensor_parallel_size)" if rollout else "devices"
            raise ConfigError(f"system.device_map.{role} has {n} {what}, which does not divide the step's {b.samples_per_step} samples (prompts_per_step x samples_per_prompt); use a divisor or change the batch.")
        if n and role in ("actor", "critic") and b.mini_batch % (n * min(b.micro_batch, b.mini_batch // n)):
            raise ConfigError(f"system.batch.mini_batch_size {b.mini_batch} must be a multiple of the {role} group's {n} devices x micro_batch_size = {n * b.micro_batch}; change one of them.")


def check_rollout_replicas(recipe: Recipe) -> None:
    """controller single: a rollout replica of several GPUs is one Ray actor holding them whole, so no other role
    may time-share them."""
    sysc = recipe.system
    tp = sysc.rollout.tensor_parallel_size
    if sysc.controller != "single" or tp == 1 or not backend_of(sysc.rollout).in_trainer_ranks:
        return
    shared = sorted({d for r in recipe.roles if r != "rollout" for d in sysc.device_map.get(r) or []}
                    & set(sysc.device_map.get("rollout") or []))
    if shared:
        raise ConfigError(f"system.rollout.tensor_parallel_size {tp} under system.controller=single gives each rollout replica its GPUs whole, but GPU {shared[0]} is also another role's; give the rollout GPUs of its own, or use controller spmd to colocate a tensor-parallel engine.")


def check_weight_sync(recipe: Recipe, cuda_count: int) -> None:
    sysc = recipe.system
    if sysc.controller != "single" or sysc.weight_sync != "collective":
        return
    rollout, actor = sysc.device_map.get("rollout") or [], sysc.device_map.get("actor") or [0]
    if not rollout:
        raise ConfigError("system.weight_sync=collective needs a rollout worker group, and system.device_map.rollout is empty (a vLLM server gets weights over HTTP); use weight_sync=object_store.")
    if on_gpu(sysc.device, cuda_count) and actor[0] in rollout:
        raise ConfigError(f"system.weight_sync=collective: NCCL cannot broadcast between two processes on one GPU, and actor rank 0 shares GPU {actor[0]} with a rollout worker; use weight_sync=object_store or put the rollout on other GPUs.")


def check_ray(recipe: Recipe) -> None:
    """controller single: Ray is installed, and the cluster at ``system.ray_address`` (if any) answers."""
    if recipe.system.controller != "single":
        return
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("system.controller=single needs Ray, which is not installed; run `pip install -e \".[ray]\"` or use controller spmd.")
    check_ray_address(recipe.system.ray_address)


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
