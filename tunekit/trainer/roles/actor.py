"""The actor: the policy being trained (FSDP2-sharded), its logprobs, its PPO update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.trainer import algos
from tunekit.trainer.batch import Batch, micro_batches, response_logprobs, select, to
from tunekit.trainer.parallel import Dist, clip_grad_norm, full_params, shard


class Actor:
    def __init__(self, model: nn.Module, *, algo: AlgorithmConfig, mem: MemoryConfig, dist: Dist,
                 micro_batch: int, temperature: float) -> None:
        self.dist, self.algo, self.micro, self.temperature = dist, algo, micro_batch, temperature
        self.model = shard(model, mem, dist.device, dist.world)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=algo.actor_lr, weight_decay=0.0)

    @torch.no_grad()
    def logprobs(self, batch: Batch) -> torch.Tensor:
        """Recomputed logprobs of the responses under the current policy. [B, R]."""
        self.model.eval()
        out = [response_logprobs(self.model, to(mb, self.dist.device), self.temperature)
               for mb in micro_batches(batch, self.micro)]
        return torch.cat(out).cpu()

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches, gradients accumulated over micro-batches.

        ``batch`` holds this rank's samples with ``old_logprobs`` and ``advantages``;
        ``mini_batch`` is this rank's share of a global mini-batch.
        """
        self.model.train()
        gen = torch.Generator().manual_seed(seed)
        n = batch["input_ids"].shape[0]
        stats: dict[str, list[float]] = {"actor/pg_loss": [], "actor/clipfrac": [], "actor/approx_kl": [], "actor/grad_norm": []}
        for _ in range(self.algo.ppo_epochs):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, mini_batch):
                mini = select(batch, order[start : start + mini_batch])
                self.optim.zero_grad(set_to_none=True)
                for mb in micro_batches(mini, self.micro):
                    mb = to(mb, self.dist.device)
                    logp = response_logprobs(self.model, mb, self.temperature)
                    loss, clipfrac, kl = algos.ppo_policy_loss(
                        logp, mb["old_logprobs"], mb["advantages"], mb["response_mask"], self.algo.clip_ratio)
                    (loss * mb["input_ids"].shape[0] / mini["input_ids"].shape[0]).backward()
                    stats["actor/pg_loss"].append(loss.detach())
                    stats["actor/clipfrac"].append(clipfrac.detach())
                    stats["actor/approx_kl"].append(kl.detach())
                stats["actor/grad_norm"].append(clip_grad_norm(self.model, self.algo.max_grad_norm).detach())
                self.optim.step()
        return {k: float(torch.stack(v).float().mean()) for k, v in stats.items() if v}

    def named_full_params(self):
        """Full (unsharded) parameters one at a time, for weight sync to the rollout engine."""
        return full_params(self.model)
