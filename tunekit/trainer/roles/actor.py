"""The actor: the policy being trained (FSDP2-sharded), its logprobs, its PPO update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.trainer import algos
from tunekit.placement.dist import Dist
from tunekit.trainer.batch import Batch, per_micro_batch, response_logprobs, response_logprobs_and_entropy
from tunekit.trainer.optim import adamw
from tunekit.trainer.parallel import full_params, shard
from tunekit.trainer.update import ppo_update


class Actor:
    def __init__(self, model: nn.Module, *, algo: AlgorithmConfig, mem: MemoryConfig, dist: Dist,
                 micro_batch: int, temperature: float, max_response_tokens: int | None = None,
                 compile: bool = False, cuda_graphs: bool = False) -> None:
        """``max_response_tokens``: the longest response the rollout may return, the constant horizon of the
        ``seq-mean-token-sum-norm`` loss (None: each batch's padded response length)."""
        self.dist, self.algo, self.micro, self.temperature, self.compiled = dist, algo, micro_batch, temperature, compile
        self.horizon = max_response_tokens
        self.model = shard(model, mem, dist.device, dist.world, compile=compile, cuda_graphs=cuda_graphs)
        masters = mem.keeps_masters(gpu=dist.device.type == "cuda", world=dist.world)
        self.optim = adamw(self.model, algo.actor_lr, master_weights=masters)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        """Recomputed logprobs of the responses under the current policy. [B, R]."""
        self.model.eval()
        return per_micro_batch(lambda mb: response_logprobs(self.model, mb, self.temperature, compiled=self.compiled),
                               batch, self.micro, self.dist.device, trim=not self.compiled)

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches, gradients accumulated over micro-batches.

        ``batch`` holds this rank's samples with ``advantages`` (``old_logprobs`` unless the update is
        exactly on-policy, ``ref_logprobs`` when the KL is a loss term); ``mini_batch`` is this rank's share
        of a global mini-batch.
        """
        return ppo_update(self.model, self.optim, batch, loss_fn=self.loss, mini_batch=mini_batch,
                          micro_batch=self.micro, epochs=self.algo.ppo_epochs, seed=seed,
                          max_grad_norm=self.algo.max_grad_norm, dist=self.dist, prefix="actor", loss_name="pg_loss",
                          loss_agg_mode=self.algo.loss_agg_mode, trim=not self.compiled,
                          # Dr. GRPO without a fixed horizon divides by the response width: keep it whole
                          trim_response=self.horizon is not None or self.algo.loss_agg_mode != "seq-mean-token-sum-norm")

    def loss(self, model: nn.Module, mb: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor's loss on one micro-batch, as verl's actor composes it: the clipped policy loss, minus
        ``entropy_coef`` x entropy, plus ``kl_coef`` x KL to the reference when the KL is a loss term; each
        term aggregated by ``loss_agg_mode``. Returns (loss, stats); the stat ``pg_loss`` (reported by the
        update) is the policy term alone."""
        a, mask = self.algo, mb["response_mask"]
        if a.entropy_coef > 0:
            logp, entropy = response_logprobs_and_entropy(model, mb, self.temperature, compiled=self.compiled)
        else:
            logp, entropy = response_logprobs(model, mb, self.temperature, compiled=self.compiled), None
        # an exactly on-policy update (see Trainer.recompute_old_logprobs) has no old logprobs: its weights have
        # not moved before this forward, so they equal logp (ratio 1, the same gradient), and the on-policy
        # check compares the rollout's logprobs with these
        old = mb["old_logprobs"] if "old_logprobs" in mb else logp.detach()
        agg = {"loss_agg_mode": a.loss_agg_mode, "horizon": self.horizon}
        pg_loss, stats = algos.ppo_policy_loss(logp, old, mb["advantages"], mask, clip_ratio_low=a.clip_low,
                                               clip_ratio_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, **agg)
        loss = pg_loss
        if entropy is not None:
            entropy_agg = algos.agg_loss(entropy, mask, a.loss_agg_mode, self.horizon)
            loss = loss - a.entropy_coef * entropy_agg
            stats["entropy"] = entropy_agg.detach()
        if a.kl_in_loss:
            kl_loss = algos.agg_loss(algos.kl_penalty(logp, mb["ref_logprobs"], a.kl_kind), mask, a.loss_agg_mode,
                                     self.horizon)
            loss = loss + a.kl_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach()
        if "old_logprobs" not in mb:  # what the loop measures on old logprobs when it has them
            if "rollout_logprobs" in mb:
                stats["rollout_logprob_abs_diff"] = algos.masked_mean((mb["rollout_logprobs"] - old).abs(), mask)
            if "ref_logprobs" in mb:
                stats["ref_kl"] = algos.masked_mean(old - mb["ref_logprobs"], mask)
        return loss, stats | {"pg_loss": pg_loss.detach()}

    def named_full_params(self):
        """Full (unsharded) parameters one at a time, for weight sync to the rollout engine."""
        return full_params(self.model)
