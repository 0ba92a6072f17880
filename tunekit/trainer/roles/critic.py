"""The critic: backbone + scalar value head (PPO only), its values and clipped value update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.trainer import algos
from tunekit.trainer.batch import Batch, micro_batches, select, to
from tunekit.trainer.parallel import Dist, clip_grad_norm, shard


def _response_values(model: nn.Module, mb: Batch) -> torch.Tensor:
    """Value of the state before each response token. [B, R]."""
    r = mb["response_mask"].shape[1]
    values = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"])
    return values[:, -r - 1 : -1].float()


class Critic:
    def __init__(self, model: nn.Module, *, algo: AlgorithmConfig, mem: MemoryConfig, dist: Dist, micro_batch: int) -> None:
        self.dist, self.algo, self.micro = dist, algo, micro_batch
        self.model = shard(model, mem, dist.device, dist.world)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=algo.critic_lr, weight_decay=0.0)

    @torch.no_grad()
    def values(self, batch: Batch) -> torch.Tensor:
        self.model.eval()
        out = [_response_values(self.model, to(mb, self.dist.device)) for mb in micro_batches(batch, self.micro)]
        return torch.cat(out).cpu()

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        self.model.train()
        gen = torch.Generator().manual_seed(seed + 1)
        n = batch["input_ids"].shape[0]
        stats: dict[str, list[torch.Tensor]] = {"critic/vf_loss": [], "critic/vf_clipfrac": [], "critic/grad_norm": []}
        for _ in range(self.algo.ppo_epochs):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, mini_batch):
                mini = select(batch, order[start : start + mini_batch])
                self.optim.zero_grad(set_to_none=True)
                for mb in micro_batches(mini, self.micro):
                    mb = to(mb, self.dist.device)
                    v = _response_values(self.model, mb)
                    loss, clipfrac = algos.clipped_value_loss(v, mb["old_values"], mb["returns"], mb["response_mask"], self.algo.value_clip)
                    (loss * mb["input_ids"].shape[0] / mini["input_ids"].shape[0]).backward()
                    stats["critic/vf_loss"].append(loss.detach())
                    stats["critic/vf_clipfrac"].append(clipfrac.detach())
                stats["critic/grad_norm"].append(clip_grad_norm(self.model, self.algo.max_grad_norm).detach())
                self.optim.step()
        return {k: float(torch.stack(v).float().mean()) for k, v in stats.items() if v}
