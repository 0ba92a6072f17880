"""The optimiser loop of a role's update: epochs, shuffled mini-batches, micro-batches, one step per mini-batch.

The actor and the critic each bring their own loss (``roles/actor.py``, ``roles/critic.py``); the math of
those losses lives in ``algos.py``. What this loop guarantees: micro-batching and sharding change memory
and speed, never the gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from tunekit.trainer import algos
from tunekit.trainer.batch import Batch, by_length, micro_batches, select, to
from tunekit.trainer.optim import Optimizer


def ppo_update(model: nn.Module, optim: Optimizer, batch: Batch, *, loss_fn, mini_batch: int, micro_batch: int,
               epochs: int, seed: int, max_grad_norm: float, dist, prefix: str, loss_name: str,
               loss_agg_mode: str = "token-mean", trim: bool = True, trim_response: bool = False) -> dict[str, float]:
    """Epochs over shuffled mini-batches; gradients accumulate over micro-batches, one optimizer step per mini-batch.

    ``loss_fn(model, micro_batch) -> (loss, {name: tensor})`` is the role's own loss, aggregated over the
    micro-batch by ``loss_agg_mode`` (:func:`algos.agg_loss`). Each micro-batch's loss is weighted by its
    share of the mini-batch's units over all ranks (``dist``): response tokens for ``token-mean``, responses
    for the sequence means (:func:`algos.agg_units`), so the update is the aggregate of the global
    mini-batch. Within a mini-batch the rows go shortest first and each micro-batch drops the padding
    columns none of its rows uses (:func:`~tunekit.trainer.batch.used_columns`; the response's trailing ones
    only with ``trim_response``, for a loss that does not read the response width): the same sum of
    gradients, fewer padded tokens through the model. ``trim=False`` keeps every micro-batch as wide as the
    batch, for a compiled model (a micro-batch's own number of response positions would compile more graphs).
    Returns the mean of every stat over the micro-batches,
    prefixed, read from the device once; the loss is reported as ``loss_name`` unless ``loss_fn`` reports a
    stat of that name itself.
    """
    model.train()
    gen = torch.Generator().manual_seed(seed)
    n = batch["input_ids"].shape[0]
    stats: dict[str, list[torch.Tensor]] = {}
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, mini_batch):
            host = select(batch, order[start : start + mini_batch])
            host = select(host, by_length(host))
            # global units / world: FSDP then averages the ranks' gradients into the global aggregate
            units = dist.mean(algos.agg_units(host["response_mask"], loss_agg_mode))
            # one copy per tensor and mini-batch; the micro-batches are views of it on the device
            mini = to(host, dist.device)
            optim.zero_grad()
            for mb in micro_batches(mini, micro_batch, host=host if trim else None, trim_response=trim_response):
                loss, extra = loss_fn(model, mb)
                (loss * algos.agg_units(mb["response_mask"], loss_agg_mode) / max(units, 1.0)).backward()
                optim.accumulate()
                for k, v in {loss_name: loss, **extra}.items():
                    stats.setdefault(k, []).append(v.detach())
            stats.setdefault("grad_norm", []).append(optim.clip_grad_norm(max_grad_norm).detach())
            optim.step()
    on = next(iter(stats.values()))[0].device  # the gradient norm of offloaded parameters is on the host
    means = torch.stack([torch.stack(v).float().mean().to(on) for v in stats.values()]).tolist()  # one wait
    return {f"{prefix}/{k}": m for k, m in zip(stats, means)}
