"""RL post-training math (PPO / GRPO) as pure tensor-in / tensor-out functions.

Shapes: B = batch rows, T = response tokens (right-padded), V = vocabulary.
`mask` is 1 on response tokens and 0 on padding; masked entries never affect
a result, even if they hold NaN. Nothing here calls `.item()` or reads config.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "masked_mean", "masked_var", "masked_whiten", "compute_gae", "kl_penalty",
    "token_level_rewards", "agg_loss", "agg_units", "ppo_policy_loss", "clipped_value_loss", "grpo_advantages",
    "entropy_from_logits", "logprobs_from_logits",
]

KL_KINDS = ("k1", "k3", "abs", "mse")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    # where(), not x * mask, so NaN/inf in padding cannot leak through.
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over entries where `mask` is set.

    x, mask: same shape. dim None -> scalar; otherwise that dim is reduced.
    An empty mask gives 0 rather than NaN, so an all-padding micro-batch
    contributes a zero loss instead of poisoning the gradients.
    """
    x, m = _zero_masked(x, mask), mask.to(x.dtype)
    if dim is None:
        return x.sum() / m.sum().clamp(min=1)
    return x.sum(dim) / m.sum(dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over all masked entries -> scalar.

    x, mask: same shape. `unbiased` applies Bessel's correction n / (n - 1).
    Fewer than two valid entries gives 0 where verl raises: a batch with a single valid token is
    legitimate here (an all-padding micro-batch, a one-token response).
    """
    centered = x - masked_mean(x, mask)
    var = masked_mean(centered * centered, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  all_reduce_sum: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Normalise `x` to unit (unbiased) variance over masked entries.

    x, mask: same shape -> same shape. With shift_mean the result has zero
    mean; without it the original mean is kept. Masked positions are 0 (verl leaves them as they
    were); a single valid entry whitens to 0 (verl raises).
    all_reduce_sum: when `x` is one shard of a batch split over ranks, a function that sums a scalar
    tensor over the ranks; the count, mean and variance are then those of the whole batch, so sharding
    does not change the result. None: `x` is the whole batch.
    """
    def total(t: Tensor) -> Tensor:
        return all_reduce_sum(t) if all_reduce_sum is not None else t

    n = total(mask.to(x.dtype).sum())
    mean = total(_zero_masked(x, mask).sum()) / n.clamp(min=1)
    centered = x - mean
    var = total(_zero_masked(centered * centered, mask).sum()) / (n - 1).clamp(min=1)
    whitened = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_masked(whitened, mask)


@torch.no_grad()
def compute_gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation over right-padded responses.

    token_rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]).
    delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1},
    with V and A after the last valid token taken as 0. returns = A + V.
    Advantages are not whitened (verl whitens inside; here the caller does, see
    :func:`masked_whiten`); padding is 0 in both outputs.
    """
    rewards = _zero_masked(token_rewards, mask)
    values = _zero_masked(values, mask)
    m = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * m[:, t]
        next_value = values[:, t]
        advantages[:, t] = next_adv
    returns = _zero_masked(advantages + values, mask)
    return advantages, returns


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL(policy || ref) estimate from sampled-token log-probs (Schulman's k1 / k2 / k3).

    logprobs, ref_logprobs: [B, T] -> [B, T]. kind (verl's name in brackets):
      "k1" ("kl"): logp - ref; unbiased, can be negative.
      "k3" ("low_var_kl"): exp(d) - d - 1 with d = ref - logp; unbiased, >= 0, lower variance. As verl does,
          d is clamped to +-20 and the estimate to +-10 (logp = -5, ref = 0 gives 10, not 142.4): tokens
          past the clamp get no gradient from it.
      "abs": |logp - ref|;  "mse" ("k2"): 0.5 * (logp - ref)^2, whose gradient is that of the true KL.
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k3":
        d = (-diff).clamp(-20.0, 20.0)
        return (torch.expm1(d) - d).clamp(-10.0, 10.0)
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    raise ValueError(f"unknown KL kind {kind!r}; use one of {', '.join(KL_KINDS)}")


def token_level_rewards(
    scores: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float
) -> Tensor:
    """Spread sequence scores over tokens, with an optional per-token KL penalty.

    scores: [B]; mask, kl: [B, T] -> [B, T]. Each row's score sits on its last
    valid token; every valid token gets -kl_coef * kl; padding is 0. A row with
    no valid token gets all zeros.
    """
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (positions * mask.bool()).argmax(dim=1, keepdim=True)
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rewards.scatter_(1, last, scores.unsqueeze(1))
    if kl is not None:
        rewards = rewards - kl_coef * kl
    return _zero_masked(rewards, mask)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, horizon: int | None = None) -> Tensor:
    """A per-token loss aggregated to a scalar, with verl's ``loss_agg_mode`` meanings.

    loss_mat, mask: [B, T] -> scalar.
      "token-mean": mean over every valid token of the batch (long responses weigh more).
      "seq-mean-token-mean": each response's token mean, then the mean over responses.
      "seq-mean-token-sum-norm": each response's token sum divided by `horizon`, then the mean over
          responses (Dr. GRPO: no length normalisation); `horizon` defaults to T, as verl's
          ``loss_scale_factor``; give the maximum response length so that it stays constant.
    Responses without a valid token are left out of the sequence means (0 if none is valid). This is the
    local aggregate; :func:`agg_units` says what it is a mean over, so that a caller can weight shards and
    micro-batches into the aggregate of the whole batch.
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    tokens = mask.to(loss_mat.dtype).sum(-1)
    sums = _zero_masked(loss_mat, mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = sums / tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = sums / (horizon if horizon is not None else mask.shape[-1])
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")
    return masked_mean(per_seq, tokens > 0)


def agg_units(mask: Tensor, mode: str) -> Tensor:
    """How many units :func:`agg_loss` averaged over: valid tokens for "token-mean", else responses with a
    valid token. mask: [B, T] -> scalar. Weighting each micro-batch's aggregate by its units over the
    whole batch's gives the aggregate of the whole batch."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")
    if mode == "token-mean":
        return mask.sum()
    return (mask.sum(-1) > 0).sum()


def ppo_policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, clip_ratio_low: float,
    clip_ratio_high: float, clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean", horizon: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss with asymmetric clipping and dual-clip, as verl's vanilla policy loss.

    logprobs, old_logprobs, advantages, mask: [B, T] -> (loss, stats), loss a scalar aggregated by
    :func:`agg_loss` (`loss_agg_mode`, `horizon`). With r = exp(logp - old) (the log-ratio clamped to +-20):
    per token max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)); where A < 0 that is further
    capped at -A * clip_ratio_c (dual-clip, clip_ratio_c > 1), so a token whose ratio ran far up cannot
    dominate the batch. stats (detached scalars, token means, verl's names): "pg_clipfrac", the share of tokens
    where the clipped term won; "pg_clipfrac_lower", the share where the dual-clip cap won; "ppo_kl",
    mean(old - logp), the k1 estimate of KL(old || new).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pessimistic = torch.maximum(unclipped, clipped)
    cap = -advantages * clip_ratio_c
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(pessimistic, cap), pessimistic)
    loss = agg_loss(per_token, mask, loss_agg_mode, horizon)
    stats = {
        "pg_clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), mask).detach(),
        "pg_clipfrac_lower": masked_mean(((pessimistic > cap) & negative).to(ratio.dtype), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return loss, stats


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_range: float
) -> tuple[Tensor, Tensor]:
    """PPO value loss with the new value clipped to old +- clip_range.

    values, old_values, returns, mask: [B, T] -> (loss, clipfrac), scalars.
    loss = 0.5 * mean(max((v - R)^2, (v_clip - R)^2)); clipfrac is the share
    of tokens where the clipped error was larger (detached).
    """
    v_clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    err = (values - returns).square()
    err_clipped = (v_clipped - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(err, err_clipped), mask)
    clipfrac = masked_mean((err_clipped > err).to(values.dtype), mask).detach()
    return loss, clipfrac


def grpo_advantages(
    scores: Tensor, group_size: int, eps: float = 1e-6, normalize_std: bool = True
) -> Tensor:
    """GRPO outcome advantages: score relative to its prompt's group.

    scores: [B] with each run of `group_size` consecutive rows sampled from one
    prompt -> [B]. advantage = (score - group mean) / (group std + eps), std
    unbiased; without normalize_std just score - group mean (Dr. GRPO).
    A group of one is refused: verl gives it its raw score as advantage (mean 0, std 1), which is no
    baseline at all; here the recipe must sample at least two responses per prompt.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 for GRPO, got {group_size}")
    if scores.shape[0] % group_size:
        raise ValueError(
            f"batch of {scores.shape[0]} scores does not split into groups of {group_size}; "
            "make the batch a multiple of group_size"
        )
    groups = scores.float().view(-1, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if normalize_std:
        centered = centered / (groups.std(dim=1, keepdim=True) + eps)
    return centered.view(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax distribution at each position.

    logits: [B, T, V] -> [B, T], in nats. Computed in the logits' dtype;
    pass float32 logits where precision matters.
    """
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each label under the softmax of `logits / temperature`, in float32 at least.

    logits: [B, T, V] (any float dtype), labels: [B, T] (int64 token ids) -> [B, T]. Picks the
    label's logit and subtracts the row's logsumexp instead of materialising the whole log-softmax, which
    autograd would keep for the backward pass: one [B, T, V] tensor less per micro-batch (the LM head's
    vocabulary is most of it).
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
