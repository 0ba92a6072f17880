"""The critic: backbone + scalar value head (PPO only), its values and clipped value update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.trainer import algos
from tunekit.placement.dist import Dist
from tunekit.trainer.batch import Batch, per_micro_batch
from tunekit.trainer.optim import adamw
from tunekit.trainer.parallel import shard
from tunekit.trainer.update import ppo_update


def _response_values(model: nn.Module, mb: Batch) -> torch.Tensor:
    """Value of the state before each response token. [B, R]."""
    r = mb["response_mask"].shape[1]
    values = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"])
    return values[:, -r - 1 : -1].float()


class Critic:
    def __init__(self, model: nn.Module, *, algo: AlgorithmConfig, mem: MemoryConfig, dist: Dist, micro_batch: int,
                 compile: bool = False, cuda_graphs: bool = False) -> None:
        self.dist, self.algo, self.micro, self.compiled = dist, algo, micro_batch, compile
        self.model = shard(model, mem, dist.device, dist.world, compile=compile, cuda_graphs=cuda_graphs)
        masters = mem.keeps_masters(gpu=dist.device.type == "cuda", world=dist.world)
        self.optim = adamw(self.model, algo.critic_lr, master_weights=masters)

    def values(self, batch: Batch) -> torch.Tensor:
        self.model.eval()
        return per_micro_batch(lambda mb: _response_values(self.model, mb), batch, self.micro, self.dist.device,
                               trim=not self.compiled)

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        def loss_fn(model, mb):
            v = _response_values(model, mb)
            loss, clipfrac = algos.clipped_value_loss(v, mb["old_values"], mb["returns"], mb["response_mask"], self.algo.value_clip)
            return loss, {"vf_clipfrac": clipfrac}

        return ppo_update(self.model, self.optim, batch, loss_fn=loss_fn, mini_batch=mini_batch, micro_batch=self.micro,
                          epochs=self.algo.ppo_epochs, seed=seed + 1, max_grad_norm=self.algo.max_grad_norm,
                          dist=self.dist, prefix="critic", loss_name="vf_loss", trim=not self.compiled,
                          trim_response=True)
