"""CPU tests for tunekit.trainer.algos against hand-computed values."""

import math

import pytest
import torch

from tunekit.trainer import algos

NAN = float("nan")


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


def test_masked_mean_ignores_padding_even_nan():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    close(algos.masked_mean(x, mask), (1 + 2 + 4) / 3)
    close(algos.masked_mean(x, mask, dim=-1), [1.5, 4.0])
    # An all-padding batch gives 0, not NaN.
    close(algos.masked_mean(x, torch.zeros_like(mask)), 0.0)


def test_masked_var_unbiased_and_biased():
    x = torch.tensor([1.0, 2.0, 3.0, 99.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean 2, squared deviations 1 + 0 + 1 = 2 -> 2/2 unbiased, 2/3 biased.
    close(algos.masked_var(x, mask), 1.0)
    close(algos.masked_var(x, mask, unbiased=False), 2 / 3)
    close(algos.masked_var(x, torch.tensor([1, 0, 0, 0])), 0.0)


def test_masked_whiten():
    x = torch.tensor([[2.0, 4.0, 6.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2.
    close(algos.masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
    close(algos.masked_whiten(x, mask, shift_mean=False), [[3.0, 4.0, 5.0, 0.0]])


def test_masked_whiten_over_shards_is_the_whole_batch_whitened():
    import threading

    x = torch.tensor([[2.0, 4.0, 6.0, 50.0], [1.0, -3.0, 0.0, 0.0], [7.0, 8.0, 9.0, 10.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    whole = algos.masked_whiten(x, mask)
    # two "ranks" with one and two rows: the hook sums each scalar over both, as an all-reduce would
    slots, barrier, out = [None, None], threading.Barrier(2), [None, None]

    def rank(r: int, rows: slice) -> None:
        def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
            slots[r] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        out[r] = algos.masked_whiten(x[rows], mask[rows], all_reduce_sum=all_reduce_sum)

    threads = [threading.Thread(target=rank, args=(0, slice(0, 1))), threading.Thread(target=rank, args=(1, slice(1, 3)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    close(torch.cat(out), whole)
    # each shard whitened alone would not be
    assert not torch.allclose(algos.masked_whiten(x[:1], mask[:1]), whole[:1], atol=1e-3)


def test_gae_hand_computed():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    # Row 0: 3 valid tokens, then padding holding garbage that must be ignored.
    # Row 1: 1 valid token.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 3.0], [2.0, 7.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 5.0], [1.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv, ret = algos.compute_gae(rewards, values, mask, gamma, lam)
    # Row 0, V after the last token is 0:
    #   t=2: delta = 1 + 0.9*0 - 0.3 = 0.7                 A2 = 0.7
    #   t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13             A1 = -0.13 + 0.72*0.7 = 0.374
    #   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14             A0 = -0.14 + 0.72*0.374 = 0.12928
    #   returns = A + V = [0.62928, 0.774, 1.0]
    # Row 1: A0 = 2 - 1 = 1, return 2.
    close(adv, [[0.12928, 0.374, 0.7, 0.0], [1.0, 0.0, 0.0, 0.0]])
    close(ret, [[0.62928, 0.774, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])


def test_gae_with_gamma_lam_one_is_monte_carlo_return():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.3, -1.0, 4.0]])
    adv, ret = algos.compute_gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    close(ret, [[6.0, 5.0, 3.0]])  # reward-to-go, whatever the values were
    close(adv, [[5.7, 6.0, -1.0]])


def test_kl_penalty_kinds():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    close(algos.kl_penalty(logp, ref, "k1"), [[0.5, -1.0]])
    # k3 with d = ref - logp = [-0.5, 1]: e^-0.5 + 0.5 - 1 = 0.106531, e^1 - 1 - 1 = 0.718282
    close(algos.kl_penalty(logp, ref, "k3"), [[math.exp(-0.5) - 0.5, math.e - 2]])
    close(algos.kl_penalty(logp, ref, "abs"), [[0.5, 1.0]])
    close(algos.kl_penalty(logp, ref, "mse"), [[0.125, 0.5]])


def test_k3_is_nonnegative_and_zero_at_equality():
    gen = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(64, 32, generator=gen) * 3, torch.randn(64, 32, generator=gen) * 3
    assert (algos.kl_penalty(logp, ref, "k3") >= 0).all()
    close(algos.kl_penalty(logp, logp, "k3"), torch.zeros(64, 32))


def test_k3_is_clamped_as_verl_clamps_it():
    # logp = -5, ref = 0: exact k3 is e^5 - 6 = 142.4; clamped to 10, with no gradient past the clamp
    logp = torch.tensor([[-5.0, -1.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 1000.0]])
    kl = algos.kl_penalty(logp, ref, "k3")
    close(kl, [[10.0, math.e - 2, 10.0]])
    kl.sum().backward()
    # d/dlogp of e^d - d - 1 (d = ref - logp) is 1 - e^d: 1 - e for the middle token, 0 where clamped
    close(logp.grad, [[0.0, 1 - math.e, 0.0]])
    assert torch.isfinite(logp.grad).all()


def test_kl_penalty_unknown_kind_raises():
    with pytest.raises(ValueError, match="k2"):
        algos.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k2")


def test_token_level_rewards():
    scores = torch.tensor([1.0, 2.0, 5.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 9.0], [0.3, 9.0, 9.0], [9.0, 9.0, 9.0]])
    # Score on the last valid token, -0.5 * kl on valid tokens, 0 on padding.
    close(algos.token_level_rewards(scores, mask, kl, 0.5),
          [[-0.05, 1.0 - 0.1, 0.0], [2.0 - 0.15, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(algos.token_level_rewards(scores, mask, None, 0.5),
          [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def _policy_loss(logp, old, adv, mask, low=0.2, high=None, c=3.0, mode="token-mean"):
    return algos.ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=low, clip_ratio_high=low if high is None else high,
                                 clip_ratio_c=c, loss_agg_mode=mode)


def test_ppo_policy_loss_clipping():
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    old = torch.zeros(1, 4)
    # ratios: 1.5 (A>0, clipped to 1.2), 1.0, 1.5 (A<0, unclipped term is worse, kept),
    # padding with an absurd ratio.
    logp = torch.tensor([[math.log(1.5), 0.0, math.log(1.5), 30.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = _policy_loss(logp, old, adv, mask)
    # per token max(-A r, -A clip(r)): max(-1.5, -1.2) = -1.2; -1; max(1.5, 1.2) = 1.5
    close(loss, (-1.2 - 1.0 + 1.5) / 3)
    close(stats["pg_clipfrac"], 1 / 3)
    close(stats["pg_clipfrac_lower"], 0.0)  # 1.5 is under the dual-clip cap 3
    # old - new logprob: -ln 1.5 = -0.405465 twice, 0 once (the padding's 30 is masked out)
    close(stats["ppo_kl"], -0.8109302162 / 3)
    loss.backward()
    # d/dlogp of -A r is -A r / 3: clipped token and padding get no gradient.
    close(logp.grad, [[0.0, -1 / 3, 0.5, 0.0]])


def test_ppo_policy_loss_asymmetric_clip():
    # ratio 1.25 with A = +1: clip-high 0.28 leaves it alone, a symmetric 0.2 clips it to 1.2.
    # ratio 0.75 with A = -1: clip-low 0.2 clips it to 0.8 (-A r = 0.75 < 0.8: the clipped term wins).
    logp = torch.log(torch.tensor([[1.25, 0.75]]))
    adv, mask, old = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), torch.zeros(1, 2)
    loss, stats = _policy_loss(logp, old, adv, mask, low=0.2, high=0.28)
    close(loss, (-1.25 + 0.8) / 2)
    close(stats["pg_clipfrac"], 0.5)
    loss_sym, stats_sym = _policy_loss(logp, old, adv, mask, low=0.2)
    close(loss_sym, (-1.2 + 0.8) / 2)
    close(stats_sym["pg_clipfrac"], 1.0)


def test_ppo_policy_loss_dual_clip_caps_negative_advantages():
    # A = -2 with ratio 5: max(-A r, -A clip(r)) = max(10, 2.4) = 10, capped at -A c = 2 * 3 = 6.
    # A = +2 with ratio 5: clipped to 1.2 -> -2.4; the cap applies to negative advantages only.
    logp = torch.log(torch.tensor([[5.0, 5.0]])).requires_grad_()
    adv, mask, old = torch.tensor([[-2.0, 2.0]]), torch.ones(1, 2), torch.zeros(1, 2)
    loss, stats = _policy_loss(logp, old, adv, mask, c=3.0)
    close(loss, (6.0 - 2.4) / 2)
    close(stats["pg_clipfrac_lower"], 0.5)
    loss.backward()
    close(logp.grad, [[0.0, 0.0]])  # the cap is a constant: no gradient through it
    loss_c10, _ = _policy_loss(logp.detach(), old, adv, mask, c=10.0)
    close(loss_c10, (10.0 - 2.4) / 2)


def test_agg_loss_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, NAN, NAN, NAN], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4
    close(algos.agg_loss(loss, mask, "token-mean"), 2.5)
    # seq-mean-token-mean: row means 2 and 4; the row without a valid token is left out
    close(algos.agg_loss(loss, mask, "seq-mean-token-mean"), 3.0)
    # seq-mean-token-sum-norm: row sums 6 and 4 over the horizon, then their mean
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum-norm", horizon=8), (6 / 8 + 4 / 8) / 2)
    close(algos.agg_loss(loss, mask, "seq-mean-token-sum-norm"), (6 / 4 + 4 / 4) / 2)  # default: T
    assert int(algos.agg_units(mask, "token-mean")) == 4
    assert int(algos.agg_units(mask, "seq-mean-token-mean")) == 2
    assert int(algos.agg_units(mask, "seq-mean-token-sum-norm")) == 2
    with pytest.raises(ValueError, match="seq-mean-token-sum"):
        algos.agg_loss(loss, mask, "seq-mean-token-sum")


def test_policy_loss_aggregation_weighs_short_responses_up_in_seq_mean():
    # one token with A = 1 in a 1-token response, three with A = -1 in a 3-token response, ratio 1
    adv = torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    logp = torch.zeros(2, 3)
    close(_policy_loss(logp, logp, adv, mask, mode="token-mean")[0], (-1 + 3) / 4)
    close(_policy_loss(logp, logp, adv, mask, mode="seq-mean-token-mean")[0], (-1 + 1) / 2)
    close(_policy_loss(logp, logp, adv, mask, mode="seq-mean-token-sum-norm")[0], (-1 / 3 + 3 / 3) / 2)


def test_clipped_value_loss():
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.zeros(1, 3)
    values = torch.tensor([[0.5, -0.1, 42.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = algos.clipped_value_loss(values, old, returns, mask, 0.2)
    # token 0: unclipped (0.5-1)^2 = 0.25, clipped v=0.2 -> 0.64; max 0.64 (clipped won)
    # token 1: -0.1 is inside +-0.2 -> both 1.21
    close(loss, 0.5 * (0.64 + 1.21) / 2)
    close(clipfrac, 0.5)


def test_grpo_advantages():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    # Group [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5/0.70711 = +-0.70711.
    # Group [1, 1]: zero spread -> 0 (eps keeps it finite).
    close(algos.grpo_advantages(scores, 2), [0.70711, -0.70711, 0.0, 0.0], tol=1e-4)
    close(algos.grpo_advantages(scores, 2, normalize_std=False), [0.5, -0.5, 0.0, 0.0])
    # One group of 4: mean 0.75, unbiased std 0.5.
    close(algos.grpo_advantages(scores, 4), [0.5, -1.5, 0.5, 0.5], tol=1e-4)


@pytest.mark.parametrize("batch,group_size", [(3, 2), (4, 1)])
def test_grpo_bad_group_raises(batch, group_size):
    with pytest.raises(ValueError, match="group"):
        algos.grpo_advantages(torch.ones(batch), group_size)


def test_entropy_and_logprobs_from_logits():
    # Row 0: [0, ln 3, -50, -50] -> p ~ [0.25, 0.75, 0, 0]; row 1 uniform over 4 -> ln 4.
    logits = torch.tensor([[[0.0, math.log(3.0), -50.0, -50.0], [1.0, 1.0, 1.0, 1.0]]])
    entropy = algos.entropy_from_logits(logits)
    close(entropy, [[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(4.0)]], tol=1e-4)
    labels = torch.tensor([[1, 2]])
    close(algos.logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.25)]], tol=1e-4)
    # sampled at temperature 2 the logits halve: row 0 is [0, ln sqrt 3, -25, -25], p(1) = sqrt 3 / (1 + sqrt 3)
    halved = [[math.log(math.sqrt(3.0) / (1.0 + math.sqrt(3.0))), math.log(0.25)]]
    close(algos.logprobs_from_logits(logits, labels, temperature=2.0), halved, tol=1e-4)


def test_logprobs_from_logits_matches_log_softmax_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 50, generator=g, dtype=torch.float64) * 4).requires_grad_()
    labels = torch.randint(0, 50, (3, 5), generator=g)
    want = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    got = algos.logprobs_from_logits(logits, labels)
    assert torch.allclose(got, want, atol=1e-12)
    (gw,) = torch.autograd.grad(want.sum(), logits)
    (gg,) = torch.autograd.grad(algos.logprobs_from_logits(logits, labels).sum(), logits)
    assert torch.allclose(gg, gw, atol=1e-12)
