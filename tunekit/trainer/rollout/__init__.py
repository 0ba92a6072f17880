"""Rollout backends, one module each; :data:`BACKENDS` maps ``system.rollout.backend`` to the backend's spec
(:class:`~tunekit.trainer.rollout.spec.BackendSpec`: its engine class and its rules). Only the vLLM modules
import vllm, and only when an engine is built."""

from __future__ import annotations

from tunekit.config import RolloutConfig, SystemConfig
from tunekit.trainer.rollout import hf, vllm_engine, vllm_server
from tunekit.trainer.rollout.spec import BackendSpec

BACKENDS: dict[str, BackendSpec] = {"hf": hf.SPEC, "vllm": vllm_engine.SPEC, "vllm_server": vllm_server.SPEC}


def backend_of(rc: RolloutConfig) -> BackendSpec:
    return BACKENDS[rc.backend]


def trainer_devices(sysc: SystemConfig) -> list[int]:
    """Devices that run trainer ranks (:meth:`BackendSpec.trainer_devices` of the recipe's backend)."""
    return backend_of(sysc.rollout).trainer_devices(sysc)


def trainer_world_size(sysc: SystemConfig) -> int:
    """Number of trainer ranks (spmd) or trainer GPUs."""
    return max(1, len(trainer_devices(sysc)))
