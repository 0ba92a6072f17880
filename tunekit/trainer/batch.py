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

from tunekit.trainer.algos import entropy_from_logits, logprobs_from_logits
from tunekit.trainer.parallel import sizes_apart

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


def pad_width(batch: Batch, multiple: int, pad_id: int) -> Batch:
    """``batch`` (the training layout of :func:`assemble`) with masked columns prepended to its prompt until its
    width is a multiple of ``multiple``: a batch of one more left padding, so every token's forward is the same
    (pad id, attention 0, position 0). A forward replayed as CUDA graphs records a graph per width; rounding the
    width bounds how many it records."""
    width = batch["input_ids"].shape[1]
    extra = -width % multiple
    if not extra:
        return batch
    fill = {"input_ids": pad_id}
    return {k: (torch.cat([torch.full((v.shape[0], extra), fill.get(k, 0), dtype=v.dtype), v], dim=1)
                if v.dim() >= 2 and v.shape[1] == width else v) for k, v in batch.items()}


def select(batch: Batch, idx: torch.Tensor | slice) -> Batch:
    return {k: v[idx] for k, v in batch.items()}


def to(batch: Batch, device: torch.device) -> Batch:
    """The batch on ``device``. To a GPU from pinned host memory without blocking: a copy from pageable memory
    waits for the GPU to drain, which would stall the host between the passes of an update."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v if v.is_cuda else v.pin_memory()).to(device, non_blocking=True) for k, v in batch.items()}


def micro_batches(batch: Batch, size: int, *, host: Batch | None = None, trim_response: bool = False) -> Iterator[Batch]:
    """Consecutive ``size``-row slices of ``batch`` (views). With ``host`` (the same rows on the host), each slice
    also loses the padding columns none of its rows uses (:func:`used_columns`, read on the host: no wait for
    the device), the response's trailing ones too with ``trim_response``."""
    n = next(iter(batch.values())).shape[0]
    for i in range(0, n, size):
        rows = slice(i, i + size)
        mb = select(batch, rows)
        yield mb if host is None else cut(mb, *used_columns(select(host, rows), trim_response=trim_response))


def by_length(batch: Batch) -> torch.Tensor:
    """Row order from the fewest to the most tokens (stable): consecutive micro-batches then hold rows of like
    length, so :func:`used_columns` cuts the most padding from each."""
    mask = batch.get("attention_mask", batch["response_mask"])
    return torch.sort(mask.sum(-1), stable=True).indices


def used_columns(batch: Batch, *, trim_response: bool) -> tuple[int, int]:
    """(first, kept): the first column of the left-padded prompt that some row uses, and how many response
    columns to keep (all; or, with ``trim_response``, up to the last one some row's ``response_mask`` marks).
    Host tensors."""
    r = batch["response_mask"].shape[1]
    prompt = batch["input_ids"].shape[1] - r
    first = 0
    if "attention_mask" in batch and prompt > 0:
        used = batch["attention_mask"][:, :prompt].any(0).nonzero()
        first = int(used[0]) if len(used) else prompt
    kept = r
    if trim_response:
        marked = batch["response_mask"].any(0).nonzero()
        kept = int(marked[-1]) + 1 if len(marked) else 1
    return first, kept


def cut(batch: Batch, first: int, kept: int) -> Batch:
    """``batch`` without its first ``first`` token columns and its response columns past ``kept``: a tensor as
    wide as ``input_ids`` [B, P + R] keeps columns ``first .. P + kept``, one as wide as the response [B, R]
    its first ``kept``. Only masked positions go, so every kept token's forward is the same."""
    width, r = batch["input_ids"].shape[1], batch["response_mask"].shape[1]
    if first == 0 and kept == r:
        return batch
    out = {}
    for k, v in batch.items():
        if v.dim() >= 2 and v.shape[1] == width:
            out[k] = v[:, first : width - r + kept]
        elif v.dim() >= 2 and v.shape[1] == r:
            out[k] = v[:, :kept]
        else:
            out[k] = v
    return out


@torch.no_grad()
def per_micro_batch(fn: Callable[[Batch], torch.Tensor], batch: Batch, size: int, device: torch.device, *,
                    trim: bool = True) -> torch.Tensor:
    """``fn`` over ``batch`` one micro-batch at a time (views of one copy on ``device``, each without the
    padding columns none of its rows uses unless ``trim`` is off), without gradients; the results [b, R']
    joined along the batch dimension, on the host, with 0 at the response positions a micro-batch did not
    compute (masked ones). A compiled model keeps ``trim`` off: its graphs take any sequence length
    (:func:`~tunekit.trainer.parallel.dynamic_shapes`), but the response positions each micro-batch keeps
    (the forward's ``logits_to_keep``) would vary too and compile more graphs."""
    r = batch["response_mask"].shape[1]
    # a forward replayed as a CUDA graph returns its tensors in the graphs' pool, where its next call writes: each
    # micro-batch's result is copied out before the next one runs
    outs = [fn(mb).clone() for mb in micro_batches(to(batch, device), size, host=batch if trim else None,
                                                   trim_response=True)]
    return torch.cat([torch.nn.functional.pad(o, (0, r - o.shape[1])) for o in outs]).cpu()


def response_logits(model: nn.Module, mb: Batch) -> torch.Tensor:
    """Logits that predict each response token. [B, R, V] (the model's dtype).

    Models that take ``logits_to_keep`` (transformers' causal LMs) run the LM head on the
    last R + 1 positions only, not on the prompt: the head is the widest matmul of a small
    model and its logits the largest activation. Models that take ``use_cache`` build no
    key/value cache (a training pass reads none), as the critic's backbone does.
    """
    r = mb["response_mask"].shape[1]
    keep = {"logits_to_keep": r + 1} if _takes_logits_to_keep(model) else {}
    if _forward_takes(type(model), "use_cache"):
        keep["use_cache"] = False
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"], **keep)
    return out.logits[:, -r - 1 : -1]


def _takes_logits_to_keep(model: nn.Module) -> bool:
    return _forward_takes(type(model), "logits_to_keep")


@functools.cache
def _forward_takes(cls: type, name: str) -> bool:
    # once per model class, not at every micro-batch's forward
    return name in inspect.signature(cls.forward).parameters


def response_logprobs(model: nn.Module, mb: Batch, temperature: float, *, compiled: bool = False) -> torch.Tensor:
    """Log-probabilities of the response tokens under ``model`` at the sampling temperature. [B, R] (float32).

    ``compiled``: one fused kernel over the vocabulary for the forward and one for the backward, instead of a
    float32 copy of the logits, a scaled copy and the softmax (as verl compiles its logprob function)."""
    return _logprobs(response_logits(model, mb), mb, temperature, compiled)


def response_logprobs_and_entropy(model: nn.Module, mb: Batch, temperature: float, *,
                                  compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`response_logprobs` and the entropy of the policy at each response position (at the sampling
    temperature), from one forward. ([B, R], [B, R]) float32. The entropy needs the whole softmax over the
    vocabulary: ask for it only when a loss uses it."""
    logits = response_logits(model, mb)
    entropy = entropy_from_logits(logits.float() / temperature)
    return _logprobs(logits, mb, temperature, compiled), entropy


def _logprobs(logits: torch.Tensor, mb: Batch, temperature: float, compiled: bool) -> torch.Tensor:
    r = mb["response_mask"].shape[1]
    fn = _compiled_logprobs() if compiled else logprobs_from_logits
    # a copy: the slice would start at the prompt's width, a storage offset Dynamo could tie to another size
    return fn(logits, mb["input_ids"][:, -r:].contiguous(), temperature)


@functools.cache
def _compiled_logprobs():
    """:func:`logprobs_from_logits` compiled, its temperature a constant of the graph. Dynamo would otherwise take
    the float as a 0-d float64 CPU tensor input, and Inductor would give it a C++ kernel: every later process loads
    that kernel through a compiler and CPU-feature checks, about 35 s of a warm start on a GPU host. A run samples at
    one temperature, so the constant costs no recompile."""
    compiled = sizes_apart(torch.compile(logprobs_from_logits, dynamic=True))
    return torch._dynamo.config.patch(specialize_float=True)(compiled)
