"""Padding columns no row of a micro-batch uses are cut before its forward: the same update, fewer tokens."""

from __future__ import annotations

import torch

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.placement.dist import Dist
from tunekit.workload.models import build_causal_lm
from tunekit.trainer.batch import cut, used_columns
from tunekit.trainer.roles.actor import Actor

PROMPTS = [2, 5, 3, 5, 1, 4, 2, 3]    # prompt tokens per row (left-padded to 5)
RESPONSES = [6, 2, 3, 6, 1, 2, 5, 3]  # response tokens per row (right-padded to 6)


def _batch(vocab: int, extra_left: int = 0, extra_right: int = 0) -> dict[str, torch.Tensor]:
    """Rows of PROMPTS / RESPONSES tokens in the training layout, padded ``extra_*`` columns wider than needed
    (the same tokens whatever the padding)."""
    g = torch.Generator().manual_seed(0)
    p, r, n = max(PROMPTS), max(RESPONSES), len(PROMPTS)
    ids = torch.randint(3, vocab, (n, p + r), generator=g)
    attn = torch.zeros(n, p + r, dtype=torch.long)
    rmask = torch.zeros(n, r, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(PROMPTS, RESPONSES)):
        attn[i, p - pl : p + rl] = 1
        rmask[i, :rl] = 1
    adv = torch.randn(n, r, generator=g) * rmask
    wide = lambda t: torch.nn.functional.pad(t, (extra_left, extra_right))  # noqa: E731
    right = lambda t: torch.nn.functional.pad(t, (0, extra_right))  # noqa: E731
    attn = wide(attn)
    return {"input_ids": wide(ids) * attn, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "response_mask": right(rmask), "advantages": right(adv)}


def test_used_columns_cut_the_shared_padding_only() -> None:
    b = _batch(100, extra_left=2, extra_right=3)
    rows = {k: v[[1, 3]] for k, v in b.items()}  # prompts 5 and 5 tokens, responses 2 and 6
    first, kept = used_columns(rows, trim_response=True)
    assert (first, kept) == (2, 6)
    assert used_columns(rows, trim_response=False) == (2, 9)
    mb = cut(rows, first, kept)
    assert mb["input_ids"].shape == (2, 11) and mb["advantages"].shape == mb["response_mask"].shape == (2, 6)
    assert torch.equal(mb["attention_mask"].sum(), rows["attention_mask"].sum())  # no token was cut


def _actor() -> Actor:
    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    return Actor(lm, algo=AlgorithmConfig(actor_lr=1e-2), mem=MemoryConfig(), dist=Dist(), micro_batch=4,
                 temperature=1.0, max_response_tokens=9)


def test_an_update_sees_each_micro_batch_without_its_padding_and_learns_the_same() -> None:
    tight, loose = _actor(), _actor()
    vocab = tight.model.config.vocab_size
    widths: list[int] = []
    loose.model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    tight.update(_batch(vocab), mini_batch=8, seed=0)
    loose.update(_batch(vocab, extra_left=4, extra_right=3), mini_batch=8, seed=0)
    # rows go shortest first: the four shortest need 4 prompt + 3 response columns, the longest 5 + 6
    assert widths == [7, 11]
    for a, b in zip(tight.model.parameters(), loose.model.parameters()):  # the gradient (Adam's first step is its sign)
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_logprobs_of_a_padded_batch_fill_the_cut_response_positions_with_zero() -> None:
    actor = _actor()
    vocab = actor.model.config.vocab_size
    tight, loose = actor.logprobs(_batch(vocab)), actor.logprobs(_batch(vocab, extra_left=4, extra_right=3))
    assert loose.shape == (8, 9)
    mask = _batch(vocab)["response_mask"].bool()
    torch.testing.assert_close(loose[:, :6][mask], tight[mask], atol=1e-5, rtol=1e-4)
    assert torch.equal(loose[:, 6:], torch.zeros(8, 3))


def test_a_compiled_model_sees_every_micro_batch_as_wide_as_the_batch() -> None:
    """trim=False (what a compiled role passes): every micro-batch as wide as the batch, so its response positions
    (the forward's ``logits_to_keep``) do not change and torch.compile traces no graph for them."""
    from tunekit.trainer.batch import per_micro_batch
    from tunekit.trainer.update import ppo_update

    actor = _actor()
    b = _batch(actor.model.config.vocab_size, extra_left=4, extra_right=3)
    widths: list[int] = []
    actor.model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    ppo_update(actor.model, actor.optim, b, loss_fn=actor.loss, mini_batch=8, micro_batch=4, epochs=1, seed=0,
               max_grad_norm=1.0, dist=actor.dist, prefix="actor", loss_name="pg_loss", trim=False)
    per_micro_batch(lambda mb: actor.model(input_ids=mb["input_ids"]).logits, b, 4, actor.dist.device, trim=False)
    assert widths == [18, 18, 18, 18]


def test_each_micro_batch_result_survives_a_forward_that_reuses_its_output_memory() -> None:
    """A forward replayed as a CUDA graph writes every call's output into the same memory (the graphs' pool): the
    rows of an earlier micro-batch must still be its own once the later ones have run."""
    from tunekit.trainer.batch import per_micro_batch

    b = _batch(32)
    pool = torch.empty(4, b["response_mask"].shape[1])

    def replay(mb):  # what a graph replay returns: a view of memory the next call overwrites
        return pool.copy_(mb["input_ids"][:, -pool.shape[1]:].float())

    out = per_micro_batch(replay, b, 4, torch.device("cpu"), trim=False)
    torch.testing.assert_close(out, b["input_ids"][:, -pool.shape[1]:].float())


def test_a_batch_padded_to_a_width_multiple_gives_every_token_the_same_logprob() -> None:
    """Forwards replayed as CUDA graphs record one graph per width: rounding a step's width to a multiple bounds
    them, with masked columns on the left that change no kept token's forward."""
    from tunekit.trainer.batch import pad_width

    actor = _actor()
    b = _batch(actor.model.config.vocab_size)  # 5 prompt + 6 response columns
    wide = pad_width(b, 8, pad_id=0)
    assert wide["input_ids"].shape == (8, 16) and torch.equal(wide["response_mask"], b["response_mask"])
    assert torch.equal(wide["attention_mask"][:, :5], torch.zeros(8, 5, dtype=torch.long))
    assert pad_width(b, 11, pad_id=0) is b and pad_width(wide, 8, pad_id=0) is wide
    from tunekit.trainer.batch import per_micro_batch, response_logprobs

    actor.model.eval()  # whole micro-batches, as a compiled role runs them (trim off)
    logp = lambda batch: per_micro_batch(lambda mb: response_logprobs(actor.model, mb, 1.0), batch, 4,  # noqa: E731
                                         actor.dist.device, trim=False)
    mask = b["response_mask"].bool()
    torch.testing.assert_close(logp(wide)[mask], logp(b)[mask], atol=1e-5, rtol=1e-4)
