"""The actor: the policy being trained (FSDP2-sharded), its logprobs, its PPO update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.trainer import algos
from tunekit.trainer.batch import Batch, per_micro_batch, ppo_update, response_logprobs
from tunekit.dist import Dist
from tunekit.trainer.parallel import adamw, full_params, shard


class Actor:
    def __init__(self, model: nn.Module, *, algo: AlgorithmConfig, mem: MemoryConfig, dist: Dist,
                 micro_batch: int, temperature: float, compile: bool = False) -> None:
        self.dist, self.algo, self.micro, self.temperature, self.compiled = dist, algo, micro_batch, temperature, compile
        self.model = shard(model, mem, dist.device, dist.world, compile=compile)
        self.optim = adamw(self.model, algo.actor_lr)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        """Recomputed logprobs of the responses under the current policy. [B, R]."""
        self.model.eval()
        return per_micro_batch(lambda mb: response_logprobs(self.model, mb, self.temperature, compiled=self.compiled),
                               batch, self.micro, self.dist.device)

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches, gradients accumulated over micro-batches.

        ``batch`` holds this rank's samples with ``old_logprobs`` and ``advantages``;
        ``mini_batch`` is this rank's share of a global mini-batch.
        """
        def loss_fn(model, mb):
            logp = response_logprobs(model, mb, self.temperature, compiled=self.compiled)
            # an exactly on-policy update (see Trainer.recompute_old_logprobs) has no old logprobs: its weights have
            # not moved before this forward, so they equal logp (ratio 1, the same gradient), and the on-policy
            # check compares the rollout's logprobs with these
            old = mb["old_logprobs"] if "old_logprobs" in mb else logp.detach()
            loss, clipfrac, kl = algos.ppo_policy_loss(logp, old, mb["advantages"], mb["response_mask"],
                                                       self.algo.clip_ratio)
            extra = {"clipfrac": clipfrac, "approx_kl": kl}
            if "old_logprobs" not in mb and "rollout_logprobs" in mb:
                extra["rollout_logprob_abs_diff"] = algos.masked_mean((mb["rollout_logprobs"] - old).abs(),
                                                                       mb["response_mask"])
            return loss, extra

        return ppo_update(self.model, self.optim, batch, loss_fn=loss_fn, mini_batch=mini_batch, micro_batch=self.micro,
                          epochs=self.algo.ppo_epochs, seed=seed, max_grad_norm=self.algo.max_grad_norm,
                          dist=self.dist, prefix="actor", loss_name="pg_loss")

    def named_full_params(self):
        """Full (unsharded) parameters one at a time, for weight sync to the rollout engine."""
        return full_params(self.model)
