"""The reference policy: a frozen copy of the initial actor, for KL."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import MemoryConfig
from tunekit.trainer.batch import Batch, per_micro_batch, response_logprobs
from tunekit.placement.dist import Dist
from tunekit.trainer.parallel import shard


class Reference:
    def __init__(self, model: nn.Module, *, mem: MemoryConfig, dist: Dist, micro_batch: int, temperature: float,
                 compile: bool = False, cuda_graphs: bool = False) -> None:
        model.requires_grad_(False)
        self.dist, self.micro, self.temperature, self.compiled = dist, micro_batch, temperature, compile
        self.model = shard(model, mem, dist.device, dist.world, trainable=False, compile=compile,
                           cuda_graphs=cuda_graphs).eval()

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return per_micro_batch(lambda mb: response_logprobs(self.model, mb, self.temperature, compiled=self.compiled),
                               batch, self.micro, self.dist.device, trim=not self.compiled)
