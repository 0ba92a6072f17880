"""The rollout batch: plain dicts of tensors, so they move between processes as they are.

Layout (as in verl): ``input_ids = [left-padded prompt | right-padded response]``;
``response_mask`` marks response tokens up to and including EOS.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tunekit.trainer.algos import logprobs_from_logits

Batch = dict[str, torch.Tensor]


def encode_prompts(tokenizer, texts: list[str]) -> Batch:
    """Left-padded prompt ids and mask (generation appends on the right)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]}


def response_mask(response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS, 0 after it. [B,R] → [B,R] long."""
    is_eos = (response_ids == eos_id).long()
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0
    return (~after_eos).long()


def assemble(prompts: Batch, response_ids: torch.Tensor, eos_id: int) -> Batch:
    """Join prompts and responses into the training layout, with mask-aware position ids."""
    rmask = response_mask(response_ids, eos_id)
    attention = torch.cat([prompts["prompt_mask"], rmask], dim=1)
    return {
        "input_ids": torch.cat([prompts["prompt_ids"], response_ids], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": rmask,
    }


def select(batch: Batch, idx: torch.Tensor | slice) -> Batch:
    return {k: v[idx] for k, v in batch.items()}


def to(batch: Batch, device: torch.device) -> Batch:
    """The batch on ``device``. To a GPU from pinned host memory without blocking: a copy from pageable memory
    waits for the GPU to drain, which would stall the host between the passes of an update."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v if v.is_cuda else v.pin_memory()).to(device, non_blocking=True) for k, v in batch.items()}


def micro_batches(batch: Batch, size: int) -> Iterator[Batch]:
    n = next(iter(batch.values())).shape[0]
    for i in range(0, n, size):
        yield select(batch, slice(i, i + size))


@torch.no_grad()
def per_micro_batch(fn: Callable[[Batch], torch.Tensor], batch: Batch, size: int, device: torch.device) -> torch.Tensor:
    """``fn`` over ``batch`` one micro-batch at a time (views of one copy on ``device``), without gradients;
    the results joined along the batch dimension, on the host."""
    return torch.cat([fn(mb) for mb in micro_batches(to(batch, device), size)]).cpu()


def response_logits(model: nn.Module, mb: Batch) -> torch.Tensor:
    """Logits that predict each response token. [B, R, V] (the model's dtype).

    Models that take ``logits_to_keep`` (transformers' causal LMs) run the LM head on the
    last R + 1 positions only, not on the prompt: the head is the widest matmul of a small
    model and its logits the largest activation.
    """
    r = mb["response_mask"].shape[1]
    keep = {"logits_to_keep": r + 1} if _takes_logits_to_keep(model) else {}
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"], **keep)
    return out.logits[:, -r - 1 : -1]


def _takes_logits_to_keep(model: nn.Module) -> bool:
    return _forward_takes_logits_to_keep(type(model))


@functools.cache
def _forward_takes_logits_to_keep(cls: type) -> bool:
    # once per model class, not at every micro-batch's forward
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def response_logprobs(model: nn.Module, mb: Batch, temperature: float, *, compiled: bool = False) -> torch.Tensor:
    """Log-probabilities of the response tokens under ``model`` at the sampling temperature. [B, R] (float32).

    ``compiled``: one fused kernel over the vocabulary for the forward and one for the backward, instead of a
    float32 copy of the logits, a scaled copy and the softmax (as verl compiles its logprob function)."""
    r = mb["response_mask"].shape[1]
    fn = _compiled_logprobs() if compiled else logprobs_from_logits
    return fn(response_logits(model, mb), mb["input_ids"][:, -r:], temperature)


@functools.cache
def _compiled_logprobs():
    return torch.compile(logprobs_from_logits, dynamic=True)


def ppo_update(model: nn.Module, optim: torch.optim.Optimizer, batch: Batch, *, loss_fn, mini_batch: int, micro_batch: int,
               epochs: int, seed: int, max_grad_norm: float, dist, prefix: str, loss_name: str) -> dict[str, float]:
    """Epochs over shuffled mini-batches; gradients accumulate over micro-batches, one optimizer step per mini-batch.

    ``loss_fn(model, micro_batch) -> (loss, {name: tensor})`` is the role's own token-mean
    loss; each micro-batch's loss is weighted by its share of the mini-batch's response
    tokens over all ranks (``dist``), so the update is the token mean of the global
    mini-batch: micro-batching and sharding change memory and speed, never the gradient.
    Returns the mean of every stat, prefixed.
    """
    from tunekit.trainer.parallel import clip_grad_norm

    model.train()
    gen = torch.Generator().manual_seed(seed)
    n = batch["input_ids"].shape[0]
    stats: dict[str, list[torch.Tensor]] = {}
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, mini_batch):
            mini = select(batch, order[start : start + mini_batch])
            # global token count / world: FSDP then averages the ranks' gradients into the global token mean
            tokens = dist.mean(mini["response_mask"].sum())
            # one copy per tensor and mini-batch; the micro-batches are views of it on the device
            mini = to(mini, dist.device)
            optim.zero_grad(set_to_none=True)
            for mb in micro_batches(mini, micro_batch):
                loss, extra = loss_fn(model, mb)
                (loss * mb["response_mask"].sum() / max(tokens, 1.0)).backward()
                for k, v in {loss_name: loss, **extra}.items():
                    stats.setdefault(k, []).append(v.detach())
            stats.setdefault("grad_norm", []).append(clip_grad_norm(model, max_grad_norm).detach())
            optim.step()
    return {f"{prefix}/{k}": float(torch.stack(v).float().mean()) for k, v in stats.items()}
