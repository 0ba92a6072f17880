"""The actor's loss terms: the KL to the reference and the entropy bonus change the gradient; where the KL acts."""

from __future__ import annotations

import math

import pytest
import torch

from tunekit.config import AlgorithmConfig, MemoryConfig, load_recipe
from tunekit.workload.models import build_causal_lm
from tunekit.trainer import algos
from tunekit.trainer.loop import Trainer
from tunekit.placement.dist import Dist
from tunekit.trainer.roles.actor import Actor


def _actor(**algo) -> Actor:
    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    return Actor(lm, algo=AlgorithmConfig(**algo), mem=MemoryConfig(), dist=Dist(), micro_batch=8, temperature=0.7,
                 max_response_tokens=6)


def _batch(vocab: int, rows: int = 6, prompt: int = 5, response: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + response), generator=g)
    rmask = torch.ones(rows, response, dtype=torch.long)
    rmask[::2, 2:] = 0  # responses of different lengths
    mask = torch.cat([torch.ones(rows, prompt, dtype=torch.long), rmask], dim=1)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": rmask, "advantages": torch.randn(rows, response, generator=g),
            "ref_logprobs": -3.0 + torch.randn(rows, response, generator=g)}


def _grad(actor: Actor, mb) -> tuple[torch.Tensor, dict]:
    actor.model.zero_grad(set_to_none=True)
    loss, stats = actor.loss(actor.model, mb)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in actor.model.parameters() if p.grad is not None]), stats


@pytest.mark.parametrize("kind", ["k1", "k3", "mse"])
def test_grpo_kl_loss_changes_the_gradient_in_proportion_to_its_coefficient(kind):
    base = _actor(name="grpo")
    mb = _batch(base.model.config.vocab_size)
    g0, stats0 = _grad(base, mb)
    assert "kl_loss" not in stats0  # no KL coefficient: the reference's logprobs are not read
    g1, stats1 = _grad(_actor(name="grpo", kl_coef=0.1, kl_estimator=kind), mb)
    g2, _ = _grad(_actor(name="grpo", kl_coef=0.2, kl_estimator=kind), mb)
    assert (g1 - g0).norm() > 1e-3 * g0.norm()
    torch.testing.assert_close(g2 - g0, 2 * (g1 - g0), rtol=1e-3, atol=1e-6)
    # the reported term is the KL of the policy to the reference, aggregated like the loss
    logp = base.logprobs(mb)
    want = algos.agg_loss(algos.kl_penalty(logp, mb["ref_logprobs"], kind), mb["response_mask"], "token-mean")
    torch.testing.assert_close(stats1["kl_loss"], want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats1["pg_loss"], stats0["pg_loss"])  # pg_loss stays the policy term alone


def test_kl_in_the_reward_leaves_the_actor_loss_alone():
    base = _actor(name="grpo")
    mb = _batch(base.model.config.vocab_size)
    g0, _ = _grad(base, mb)
    g, stats = _grad(_actor(name="grpo", kl_coef=0.1, kl_loss=False), mb)
    torch.testing.assert_close(g, g0, rtol=0, atol=0)
    assert "kl_loss" not in stats


def test_entropy_bonus_changes_the_gradient_and_reports_the_entropy():
    base = _actor()
    mb = _batch(base.model.config.vocab_size)
    g0, _ = _grad(base, mb)
    g1, stats = _grad(_actor(entropy_coef=0.01), mb)
    g2, _ = _grad(_actor(entropy_coef=0.02), mb)
    assert (g1 - g0).norm() > 1e-4 * g0.norm()
    torch.testing.assert_close(g2 - g0, 2 * (g1 - g0), rtol=1e-3, atol=1e-6)
    assert 0 < float(stats["entropy"]) <= math.log(base.model.config.vocab_size)


def _trainer(sets: list[str]) -> Trainer:
    recipe = load_recipe(None, ["algorithm.name=grpo", "system.batch.samples_per_prompt=2"] + sets)
    return Trainer(recipe, None, tokenizer=None, task=None, dist=Dist(), timer=None)


def test_grpo_kl_in_the_reward_penalises_the_scores_the_group_compares():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = {"response_mask": mask, "old_logprobs": torch.tensor([[-1.0, -1.0, 9.0], [-2.0, -2.0, -2.0]]),
             "ref_logprobs": torch.tensor([[-1.5, -1.0, 0.0], [-2.0, -2.0, -2.0]])}
    scores = torch.tensor([1.0, 1.0])
    trainer = _trainer(["algorithm.kl_coef=1.0", "algorithm.kl_loss=false"])
    trainer.advantages(batch, scores)
    # k1 summed over valid tokens: 0.5 and 0 -> penalised scores 0.5 and 1: mean 0.75, unbiased std 0.35355
    a = 0.25 / 0.353553
    torch.testing.assert_close(batch["advantages"], torch.tensor([[-a, -a, 0.0], [a, a, a]]), atol=1e-4, rtol=0)
    # the same batch with the KL in the loss: equal scores, no advantage
    trainer = _trainer(["algorithm.kl_coef=1.0"])
    trainer.advantages(batch, scores)
    assert float(batch["advantages"].abs().max()) == 0.0


@pytest.mark.parametrize("sets, recompute", [
    ([], False),                                                    # on-policy: the update's forward suffices
    (["algorithm.ppo_epochs=2"], True),                             # the second epoch's forward is off-policy
    (["system.batch.mini_batch_size=16"], True),                    # so is the second mini-batch's
    (["algorithm.kl_coef=0.1"], False),                             # KL in the loss: the update's forward suffices
    (["algorithm.kl_coef=0.1", "algorithm.kl_loss=false"], True),   # KL in the reward: needed before the update
])
def test_old_logprobs_are_recomputed_only_off_policy_or_for_a_kl_in_the_reward(sets, recompute):
    assert _trainer(sets).recompute_old_logprobs == recompute
