"""The trainer ranks that share one in-process vLLM engine (spmd with ``system.rollout.tensor_parallel_size`` > 1).

Under torchrun every rank holds a shard of one engine when the tensor-parallel size is above 1: vLLM's
``external_launcher`` executor forms its tensor-parallel groups from consecutive ranks of the ranks' process group
(ranks 0..TP-1, TP..2TP-1, ...), and every rank of a group must submit the same requests in the same order, since
each runs the engine's scheduler and sampler on its own and they stay in step only by being given the same work.
Each rank still owns its shard of the step's prompts (the data-parallel split of the loop), so before a generation
the group gathers its ranks' requests, each rank runs all of them, and keeps the rows that were its own. Every
request keeps the sampling seed its own rank gave it: the samples are those of one engine per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def engine_groups(world: int, tp: int) -> list[list[int]]:
    """The ranks of each engine: consecutive blocks of ``tp`` ranks (vLLM's own grouping of an external launcher)."""
    if tp < 1 or world % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide the {world} ranks")
    return [list(range(start, start + tp)) for start in range(0, world, tp)]


def own_rows(outputs: Sequence[Any], counts: Sequence[int], index: int) -> list[Any]:
    """The outputs of the ``index``-th member's requests, from a generation over the group's requests in member
    order (member ``i`` contributed ``counts[i]`` of them)."""
    if len(outputs) != sum(counts):
        raise ValueError(f"{len(outputs)} outputs for {sum(counts)} requests")
    start = sum(counts[:index])
    return list(outputs[start:start + counts[index]])


class EngineGroup:
    """This rank's engine group; built by every rank at once (each new process group is a collective)."""

    def __init__(self, tp: int) -> None:
        import torch.distributed as dist

        self.tp = tp
        rank, world = dist.get_rank(), dist.get_world_size()
        self.group = None
        for ranks in engine_groups(world, tp):
            group = dist.new_group(ranks, backend="gloo")  # requests are host objects
            if rank in ranks:
                self.group, self.index = group, ranks.index(rank)

    def gather(self, requests: list) -> tuple[list, list[int]]:
        """Every member's requests in member order, and how many each gave."""
        import torch.distributed as dist

        box: list[Any] = [None] * self.tp
        dist.all_gather_object(box, requests, group=self.group)
        return [r for part in box for r in part], [len(part) for part in box]
