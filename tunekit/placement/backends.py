"""What each rollout backend is and where it runs.

:data:`BACKENDS` maps ``system.rollout.backend`` to the backend's :class:`BackendSpec`. The launcher, the runners,
the trainer and the estimates ask the spec; none of them branch on a name. The engines themselves (and what each
checks before a probe) are :mod:`tunekit.trainer.rollout`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunekit.config import RolloutConfig, SystemConfig


@dataclass(frozen=True)
class BackendSpec:
    name: str
    generates_with_policy: bool
    """Generates with a torch copy of the policy (the actor's own module, or a replica synced each step), every row
    of a step in one ``generate`` call, instead of an engine that loads the policy from a checkpoint directory and
    schedules at most ``max_num_seqs`` sequences at once."""
    in_trainer_ranks: bool
    """Runs inside the trainer's processes. Otherwise it is a process tree of its own (a server): its GPUs run no
    trainer rank, and what it starts logs into the run directory."""
    served_by_url: bool
    """May be a running server at ``system.rollout.server_url``: then it needs no GPUs, checkpoint or vLLM here."""

    def external(self, rc: RolloutConfig) -> bool:
        """Whether the rollout is a running server tunekit only talks to."""
        return self.served_by_url and rc.server_url is not None

    def starts_server(self, rc: RolloutConfig) -> bool:
        """Whether tunekit starts the rollout as a server process of its own on the rollout GPUs."""
        return not self.in_trainer_ranks and not self.external(rc)

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


BACKENDS: dict[str, BackendSpec] = {
    "hf": BackendSpec(name="hf", generates_with_policy=True, in_trainer_ranks=True, served_by_url=False),
    "vllm": BackendSpec(name="vllm", generates_with_policy=False, in_trainer_ranks=True, served_by_url=False),
    "vllm_server": BackendSpec(name="vllm_server", generates_with_policy=False, in_trainer_ranks=False,
                               served_by_url=True),
}


def backend_of(rc: RolloutConfig) -> BackendSpec:
    return BACKENDS[rc.backend]


def trainer_devices(sysc: SystemConfig) -> list[int]:
    """Devices that run trainer ranks (:meth:`BackendSpec.trainer_devices` of the recipe's backend)."""
    return backend_of(sysc.rollout).trainer_devices(sysc)


def rollout_shares_trainer_gpus(sysc: SystemConfig) -> bool:
    """Whether a rollout GPU also holds a trainer role (actor, critic, reference or reward model): an engine there
    sleeps while training runs (``system.rollout.enable_sleep``), and no NCCL group can join it to the trainer."""
    rollout = set(sysc.device_map.get("rollout") or [])
    return any(rollout & set(idx) for role, idx in sysc.device_map.items() if role != "rollout")


def trainer_world_size(sysc: SystemConfig) -> int:
    """Number of trainer ranks (spmd) or trainer GPUs."""
    return max(1, len(trainer_devices(sysc)))
