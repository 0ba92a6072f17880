"""What a rollout backend needs and where it runs.

Each backend module declares one :class:`BackendSpec` (its ``SPEC``), and
:data:`tunekit.trainer.rollout.BACKENDS` maps ``system.rollout.backend`` names to them.
The launcher, the runners and the trainer ask the spec; none of them branch on a name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunekit.config import Recipe, RolloutConfig, SystemConfig
from tunekit.placement.dist import on_gpu
from tunekit.config.errors import ConfigError


def no_check(recipe: Recipe, cuda_count: int) -> None:
    """A backend with nothing to check before a probe."""


@dataclass(frozen=True)
class BackendSpec:
    name: str
    rollout: Callable[..., Any]
    """The engine class; built with keyword arguments by ``tunekit.trainer.build.build_rollout``."""
    generates_with_policy: bool
    """Generates with a torch copy of the policy (the actor's own module, or a replica synced each step) instead
    of an engine that loads the policy from a checkpoint directory."""
    in_trainer_ranks: bool
    """Runs inside the trainer's processes. Otherwise it is a process tree of its own (a server): its GPUs run no
    trainer rank, and what it starts logs into the run directory."""
    served_by_url: bool
    """May be a running server at ``system.rollout.server_url``: then it needs no GPUs, checkpoint or vLLM here."""
    check: Callable[[Recipe, int], None] = no_check
    """Preflight: raise a TunekitError (one sentence naming the key) for what this machine or recipe lacks."""

    def external(self, rc: RolloutConfig) -> bool:
        """Whether the rollout is a running server tunekit only talks to."""
        return self.served_by_url and rc.server_url is not None

    def needs_checkpoint(self, rc: RolloutConfig) -> bool:
        """Whether the trainer writes the policy to a checkpoint directory for the engine to load."""
        return not self.generates_with_policy and not self.external(rc)

    def rollout_workers(self, sysc: SystemConfig) -> list[list[int]]:
        """Single controller: the devices of each rollout worker. An engine in the worker: one worker per replica
        (``system.rollout.tensor_parallel_size`` devices each); a server: one worker on the first rollout device,
        which starts every replica's server (servers are process trees of their own)."""
        if self.in_trainer_ranks:
            return sysc.rollout_replicas
        gpus = sysc.device_map.get("rollout") or []
        return [gpus[:1]] if gpus else []

    def trainer_devices(self, sysc: SystemConfig) -> list[int]:
        """Devices that run trainer ranks: every role's, except the rollout group when it is a process of its own."""
        skip = set() if self.in_trainer_ranks else {"rollout"}
        return sorted({i for role, idx in sysc.device_map.items() if role not in skip for i in idx})


def check_vllm_here(recipe: Recipe, cuda_count: int) -> None:
    """An engine tunekit runs here needs vLLM installed and a GPU."""
    backend = recipe.system.rollout.backend
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"system.rollout.backend={backend} needs vLLM, which is not installed; run `pip install -e \".[vllm]\"` on a GPU machine or use backend hf.")
    if not on_gpu(recipe.system.device, cuda_count):
        raise ConfigError(f"system.rollout.backend={backend} needs an NVIDIA GPU and this probe runs on CPU; use backend hf on CPU.")
