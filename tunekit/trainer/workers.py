"""One rank of a role group on Ray: builds one role in its own process and exposes its methods.

A worker is a plain class; :mod:`tunekit.trainer.worker_group` wraps it with
``ray.remote`` and places it. One role per process keeps one default torch
process group per process: the role group's (gloo on CPU, NCCL on GPU), which
FSDP2 shards over.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from tunekit.config import Recipe
from tunekit.placement.dist import Dist, init_from_env, pick_device
from tunekit.metrics import GIB
from tunekit.trainer.batch import Batch
from tunekit.trainer.faults import maybe_inject
from tunekit.trainer.heap import freeze_after_warmup

# roles that shard their model with FSDP2 over the group; rollout and reward ranks are independent replicas
SHARDED_ROLES = ("actor", "critic", "ref")
# the call each role gets once a step: the heap is frozen after its first warm-up calls (heap.freeze_after_warmup)
STEP_CALL = {"actor": "update", "critic": "update", "ref": "logprobs", "rollout": "generate", "reward": "score"}


class RoleWorker:
    """Rank ``rank`` of the ``role`` group (``world`` ranks), placed on device index ``device_index``.

    Construction is cheap; :meth:`setup` joins the process group and builds the role,
    so every rank of a group can be set up at once (the process group needs them all).
    """

    def __init__(self, recipe: dict, role: str, *, rank: int, world: int, device_index: int, threads: int,
                 node: int = 0) -> None:
        self.recipe = Recipe.model_validate(recipe)
        self.role_name, self.rank, self.world, self.device_index = role, rank, world, device_index
        self.node = node
        self.role: Any = None
        self.dist = Dist()
        self.sync_group = None
        self.step_calls = 0
        torch.set_num_threads(max(1, threads))

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port on it, for rank 0 to host the group's rendezvous."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the group's process group and build the role; returns where this rank runs."""
        from tunekit.trainer.build import build_role, build_task, load_tokenizer, needs_tokenizer

        # Ray exposes only this worker's GPU, so the local device is always index 0
        if self.role_name in SHARDED_ROLES:
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world), LOCAL_RANK="0",
                              MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), GROUP_RANK=str(self.node),
                              GROUP_WORLD_SIZE=str(self.recipe.system.nnodes))
            self.dist = init_from_env(self.recipe.system.device)
        else:  # independent replicas: no process group
            self.dist = Dist(device=pick_device(self.recipe.system.device, 0), node=self.node,
                             nnodes=self.recipe.system.nnodes)
        tokenizer = load_tokenizer(self.recipe) if needs_tokenizer(self.recipe, self.role_name) else None
        task = build_task(self.recipe)
        self.role = build_role(self.recipe, self.role_name, self.dist, tokenizer, task)
        return {"role": self.role_name, "rank": self.rank, "pid": os.getpid(), "device": str(self.dist.device),
                "gpu_ids": [int(i) for i in _ray_gpu_ids()], "node": self.node, "ray_node_id": _ray_node_id()}

    # ------------------------------------------------------------ role methods

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return self._step_call("logprobs", self.role.logprobs(batch))

    def values(self, batch: Batch) -> torch.Tensor:
        return self.role.values(batch)

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        return self._step_call("update", self.role.update(batch, mini_batch=mini_batch, seed=seed))

    def generate(self, prompts: Batch, *, seed: int, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Responses, logprobs (None when none were asked for) and what the engine reports of this generation (its
        ``last_metrics``); a greedy one (an evaluation) is no step's call."""
        if greedy:
            ids, logp = self.role.generate(prompts, seed=seed, greedy=True)
            return ids, logp, {}
        ids, logp = self._step_call("generate", self.role.generate(prompts, seed=seed))
        return ids, logp, dict(getattr(self.role, "last_metrics", None) or {})

    def score(self, prompts: list, texts: list[str]) -> tuple[torch.Tensor, dict[str, tuple[float, int]]]:
        """Rewards, and what the reward's dict returns gave beside them (its ``last_extra``)."""
        scores = self._step_call("score", self.role.score(prompts, texts))
        return scores, dict(getattr(self.role, "last_extra", None) or {})

    def _step_call(self, method: str, out: Any) -> Any:
        """Count the role's once-a-step call and freeze the heap after the warm-up ones, as run_steps does in
        the driver: this process compiled, built caches or started an engine in them."""
        if STEP_CALL.get(self.role_name) == method:
            self.step_calls += 1
            freeze_after_warmup(self.step_calls, self.recipe.probe.warmup_steps)
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The actor's full weights on CPU (rank 0), in the replicas' dtype (bf16 on GPU: half the bytes of the
        fp32 masters through the object store); other ranks take part in the gathers and return None."""
        from tunekit.trainer.save_policy import gathered

        return gathered(self.recipe, self.role.named_full_params(), self.dist)

    def sync_weights(self, state: dict[str, torch.Tensor]) -> int:
        return int(self.role.sync_weights(iter(state.items())) or 0)

    # collective weight sync (tunekit.trainer.weight_sync): actor rank 0 + the rollout replicas

    def join_sync_group(self, host: str, port: int, rank: int, world: int) -> None:
        from tunekit.trainer.weight_sync import stateless_group

        self.sync_group = stateless_group(host, port, rank, world, self.dist.device)

    def weights_manifest(self) -> list:
        from tunekit.trainer.weight_sync import manifest

        return manifest(self.role.model)

    def broadcast_weights(self) -> int:
        from tunekit.trainer.weight_sync import send

        return send(self.sync_group if self.rank == 0 else None, self.role.named_full_params(), self.dist.device)

    def receive_weights(self, items: list) -> int:
        from tunekit.trainer.weight_sync import receive

        return int(self.role.sync_weights(receive(self.sync_group, items, self.dist.device)) or 0)

    def sleep(self) -> None:
        self.role.sleep()

    def wake(self) -> None:
        self.role.wake()

    # ------------------------------------------------------------ probe support

    def inject_fault(self, fault: str, step: int) -> None:
        """The last rank of the group fails the way ``fault`` says (see :mod:`tunekit.trainer.faults`)."""
        maybe_inject(fault, step=step, rank=self.rank, world=self.world)

    def peak_memory(self) -> dict[str, float]:
        """Allocator peaks since the last call, in GiB (empty on CPU)."""
        if self.dist.device.type != "cuda":
            return {}
        out = {"allocated": torch.cuda.max_memory_allocated(self.dist.device) / GIB,
               "reserved": torch.cuda.max_memory_reserved(self.dist.device) / GIB}
        torch.cuda.reset_peak_memory_stats(self.dist.device)
        return out


def _ray_gpu_ids() -> list:
    import ray

    try:
        return list(ray.get_gpu_ids())
    except Exception:  # noqa: BLE001 - only informative
        return []


def _ray_node_id() -> str | None:
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - only informative
        return None
