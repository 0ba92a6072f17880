"""Micro-batching is a systems knob: it must not change the gradient of an update."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunekit.placement.dist import Dist
from tunekit.trainer import algos
from tunekit.trainer.optim import Optimizer
from tunekit.trainer.update import ppo_update


class TinyPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Linear(4, 1)

    def forward(self, x):
        return self.w(x).squeeze(-1)


def _batch(n=8, t=5):
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(n, t, generator=g) > 0.3).long()
    mask[:, 0] = 1  # rows of very different lengths: a per-micro-batch mean would weight them differently
    return {"input_ids": torch.zeros(n, t, dtype=torch.long), "x": torch.randn(n, t, 4, generator=g),
            "old_logprobs": torch.randn(n, t, generator=g), "advantages": torch.randn(n, t, generator=g),
            "response_mask": mask}


def _grad_after_update(micro: int, mode: str = "token-mean") -> torch.Tensor:
    model = TinyPolicy()
    opt = Optimizer(torch.optim.SGD(model.parameters(), lr=0.0))  # lr 0: look at the gradient only

    def loss_fn(m, mb):
        loss, stats = algos.ppo_policy_loss(m(mb["x"]), mb["old_logprobs"], mb["advantages"], mb["response_mask"],
                                            clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode, horizon=5)
        return loss, stats

    ppo_update(model, opt, _batch(), loss_fn=loss_fn, mini_batch=8, micro_batch=micro, epochs=1, seed=0,
               max_grad_norm=1e9, dist=Dist(), prefix="actor", loss_name="pg_loss", loss_agg_mode=mode)
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
def test_gradient_is_the_same_for_every_micro_batch_size(mode):
    full = _grad_after_update(8, mode)
    for micro in (1, 2, 4):
        assert torch.allclose(_grad_after_update(micro, mode), full, atol=1e-6), micro


def test_aggregation_modes_give_different_gradients():
    # rows of different lengths: a mode that weighed tokens alike in all three would be a no-op knob
    grads = [_grad_after_update(8, mode) for mode in algos.LOSS_AGG_MODES]
    for i in range(len(grads)):
        for j in range(i + 1, len(grads)):
            assert not torch.allclose(grads[i], grads[j], atol=1e-4), (i, j)
