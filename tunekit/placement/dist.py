"""This process's place in its process group (the trainer and the profiler receive a :class:`Dist`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tunekit.placement.gpus import on_gpu
from tunekit.placement.ports import free_port


@dataclass(frozen=True)
class Dist:
    """This process's place in its data-parallel group (world 1 when not distributed)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    node: int = 0
    """The node (machine) this process runs on, of ``nnodes``: torchrun's node rank."""
    nnodes: int = 1
    local_rank: int = 0
    """This process's rank among its node's ranks: rank ``0`` of each node samples that node's GPUs."""

    @property
    def is_node_main(self) -> bool:
        return self.local_rank == 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float) -> float:
        """Mean of a scalar over the group."""
        if self.world == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank; a collective: all ranks call it."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def pick_device(kind: str, local_rank: int) -> torch.device:
    """The device of a rank (:func:`on_gpu`); each rank takes the GPU its launcher exposed at ``local_rank``."""
    if on_gpu(kind):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_from_env(device_kind: str) -> Dist:
    """Join the process group torchrun (or a Ray worker group) described in the environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_kind, local_rank)
    if (world > 1 or device.type == "cuda") and not dist.is_initialized():
        # FSDP2's mixed precision needs a process group even for one GPU
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        # on GPU a gloo backend beside NCCL serves the collectives on host tensors: with CPU offload the
        # sharded gradients (and their norm for clipping) live in host memory
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(minutes=10),
                                device_id=device if device.type == "cuda" else None)
    # torchrun's node rank and node count (GROUP_RANK / GROUP_WORLD_SIZE); a Ray worker is given its own
    node, nnodes = int(os.environ.get("GROUP_RANK", "0")), int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    return Dist(rank=rank, world=world, device=device, node=node, nnodes=nnodes, local_rank=local_rank)


def leave_group() -> None:
    """Leave the process group at the end of a run, as torch asks of every program that joined one: its
    communication threads stop before the interpreter tears down. A group left to the interpreter's exit can abort
    a rank after its last step ("terminate called without an active exception"), and torchrun's agents of the
    other nodes then wait out their exit barrier."""
    if dist.is_initialized():
        dist.destroy_process_group()
