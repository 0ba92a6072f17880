"""Response logits: the LM head runs on the response positions only, with the same values."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.workload.models import build_causal_lm
from tunekit.trainer.batch import response_logits


def _batch(vocab: int, prompt: int = 7, response: int = 5, rows: int = 3) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (rows, prompt + response), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": torch.ones(rows, response, dtype=torch.long)}


class _NoKeep(nn.Module):
    """An LM whose forward has no ``logits_to_keep`` (a remote-code model, say)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, position_ids):
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_response_logits_match_the_full_forward_with_and_without_logits_to_keep() -> None:
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32).eval()
    mb = _batch(lm.config.vocab_size)
    full = lm(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"]).logits
    with torch.no_grad():
        kept, unkept = response_logits(lm, mb), response_logits(_NoKeep(lm), mb)
    assert kept.shape == (3, 5, lm.config.vocab_size)
    torch.testing.assert_close(kept, full[:, -6:-1].float())
    torch.testing.assert_close(unkept, kept)


def test_logits_to_keep_computes_the_head_on_the_response_only() -> None:
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32).eval()
    rows: list[int] = []
    lm.lm_head.register_forward_hook(lambda _m, _i, out: rows.append(out.shape[1]))
    with torch.no_grad():
        response_logits(lm, _batch(lm.config.vocab_size, prompt=20, response=5))
    assert rows == [6]  # response + the last prompt position, not 25


def test_response_logits_build_no_key_value_cache() -> None:
    """A training pass reads no key/value cache: the blocks get none (a forward left to its config builds one)."""
    from transformers.cache_utils import Cache

    from tunekit.trainer.parallel import decoder_layers

    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32).eval()
    seen: list[bool] = []
    decoder_layers(lm)[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(any(isinstance(v, Cache) for v in kwargs.values())), with_kwargs=True)
    mb = _batch(lm.config.vocab_size)
    with torch.no_grad():
        lm(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
        response_logits(lm, mb)
        response_logits(_NoKeep(lm), mb)  # a forward without use_cache still runs
    assert seen == [True, False, True]
