"""Micro-batching is a systems knob: it must not change the gradient of an update."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.trainer import algos
from tunekit.trainer.batch import ppo_update
from tunekit.dist import Dist


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


def _grad_after_update(micro: int) -> torch.Tensor:
    model = TinyPolicy()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: look at the gradient only

    def loss_fn(m, mb):
        loss, clipfrac, _ = algos.ppo_policy_loss(m(mb["x"]), mb["old_logprobs"], mb["advantages"], mb["response_mask"], 0.2)
        return loss, {"clipfrac": clipfrac}

    ppo_update(model, opt, _batch(), loss_fn=loss_fn, mini_batch=8, micro_batch=micro, epochs=1, seed=0,
               max_grad_norm=1e9, dist=Dist(), prefix="actor", loss_name="pg_loss")
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_gradient_is_the_same_for_every_micro_batch_size():
    full = _grad_after_update(8)
    for micro in (1, 2, 4):
        assert torch.allclose(_grad_after_update(micro), full, atol=1e-6), micro
