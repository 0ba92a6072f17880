"""tunekit's RL math against verl's own functions on the same tensors, where verl is installed
(``pip install --no-deps verl tensordict pyvers omegaconf codetiming`` is enough for its ``core_algos``).

The two are meant to agree wherever tunekit does not say otherwise in a docstring (padding is zeroed here,
a one-entry variance is 0 here, a group of one is refused here): these tensors avoid those cases.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tunekit.trainer import algos

V = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")
VF = pytest.importorskip("verl.utils.torch_functional", reason="verl is not installed")

B, L = 8, 6


@pytest.fixture
def t():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(B, L, generator=g) > 0.3).float()
    mask[:, 0] = 1
    mask = torch.cumprod(mask, dim=1)  # right-padded responses of different lengths
    logp = -torch.rand(B, L, generator=g) * 3
    ref = logp + torch.randn(B, L, generator=g) * 2
    ref[0, 0] = logp[0, 0] + 30  # past k3's clamps
    return SimpleNamespace(mask=mask, logp=logp, old=logp + torch.randn(B, L, generator=g) * 0.4, ref=ref,
                           adv=torch.randn(B, L, generator=g) * 2, x=torch.randn(B, L, generator=g), g=g)


def close(a, b):
    torch.testing.assert_close(a, b.to(a.dtype), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("ours, theirs", [("k1", "kl"), ("k3", "low_var_kl"), ("abs", "abs"), ("mse", "mse")])
def test_kl_estimators(t, ours, theirs):
    close(algos.kl_penalty(t.logp, t.ref, ours) * t.mask, V.kl_penalty(t.logp, t.ref, theirs) * t.mask)


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("low, high, c", [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, 1.5)])
def test_policy_loss_and_aggregation(t, mode, low, high, c):
    close(algos.agg_loss(t.x, t.mask, mode), V.agg_loss(t.x, t.mask, mode))
    cfg = SimpleNamespace(clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high, global_batch_info={},
                          get=lambda key, default=None: {"clip_ratio_c": c}.get(key, default))
    theirs, stats = V.compute_policy_loss_vanilla(t.old, t.logp, t.adv, t.mask, loss_agg_mode=mode, config=cfg)
    ours, ours_stats = algos.ppo_policy_loss(t.logp, t.old, t.adv, t.mask, clip_ratio_low=low, clip_ratio_high=high,
                                             clip_ratio_c=c, loss_agg_mode=mode)
    close(ours, theirs)
    for name in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        close(ours_stats[name], torch.tensor(stats[f"actor/{name}"]))


def test_whitening_gae_and_grpo(t):
    close(algos.masked_whiten(t.x, t.mask) * t.mask, VF.masked_whiten(t.x, t.mask) * t.mask)
    rewards, values = torch.randn(B, L, generator=t.g) * t.mask, torch.randn(B, L, generator=t.g) * t.mask
    adv, ret = algos.compute_gae(rewards, values, t.mask, 0.99, 0.95)
    v_adv, v_ret = V.compute_gae_advantage_return(rewards, values, t.mask, 0.99, 0.95)
    close(ret * t.mask, v_ret * t.mask)
    close(algos.masked_whiten(adv, t.mask) * t.mask, v_adv * t.mask)  # verl whitens inside its GAE
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.2, 0.9])
    tokens = torch.zeros(B, L)
    tokens[torch.arange(B), t.mask.sum(-1).long() - 1] = scores
    for norm in (True, False):
        theirs, _ = V.compute_grpo_outcome_advantage(tokens, t.mask, np.repeat(np.arange(4), 2),
                                                     norm_adv_by_std_in_grpo=norm)
        close(algos.grpo_advantages(scores, 2, normalize_std=norm)[:, None] * t.mask, theirs)
