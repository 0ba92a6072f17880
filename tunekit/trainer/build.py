"""Build the models, task and roles a recipe asks for, in this process."""

from __future__ import annotations

import torch

from tunekit import models
from tunekit.config import Recipe
from tunekit.tasks import make_task
from tunekit.trainer.loop import Roles
from tunekit.trainer.parallel import Dist
from tunekit.trainer.roles.actor import Actor
from tunekit.trainer.roles.critic import Critic
from tunekit.trainer.roles.ref import Reference
from tunekit.trainer.roles.reward import ModelReward, RuleReward
from tunekit.trainer.rollout import make_rollout


def model_dtype(recipe: Recipe, device: torch.device) -> torch.dtype:
    """Master weights stay fp32 when training on CPU; on GPU bf16 unless the recipe says float32.

    On GPU with FSDP2 the mixed-precision policy computes in bf16 over fp32 masters,
    so ``auto`` keeps fp32 parameters there too.
    """
    if recipe.model.dtype == "bfloat16":
        return torch.bfloat16
    return torch.float32


def build_task(recipe: Recipe):
    return make_task(recipe.task.name, max_operand=recipe.task.max_operand)


def load_tokenizer(recipe: Recipe):
    m = recipe.model
    return models.load_tokenizer(m.tokenizer_path or m.path)


def build_policy(recipe: Recipe, tokenizer, device: torch.device | str = "cpu"):
    m = recipe.model
    vocab = len(tokenizer) if m.preset else None
    return models.build_causal_lm(path=m.path, preset=m.preset, vocab_size=vocab, dtype=model_dtype(recipe, torch.device(device)),
                                  trust_remote_code=m.trust_remote_code, seed=recipe.probe.seed, device=device)


def build_reward(recipe: Recipe, task, tokenizer, device: torch.device):
    if recipe.model.reward_model_path:
        rm = models.RewardModel(recipe.model.reward_model_path, trust_remote_code=recipe.model.trust_remote_code)
        return ModelReward(rm, tokenizer, device)
    return RuleReward(task)


def rollout_kwargs(recipe: Recipe, tokenizer) -> dict:
    t = recipe.task
    return dict(pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, max_new_tokens=t.max_new_tokens,
                temperature=t.temperature, fixed_length=t.fixed_length)


def build_local_roles(recipe: Recipe, dist: Dist, tokenizer, task) -> Roles:
    """Every role in this process (spmd: colocated on this rank's device)."""
    torch.manual_seed(recipe.probe.seed)
    sysc, dev = recipe.system, dist.device
    micro, temp = sysc.batch.micro_batch_size, recipe.task.temperature
    policy = build_policy(recipe, tokenizer)
    ref_model = models.build_reference(policy)
    critic_model = models.CriticModel.from_actor(policy) if recipe.algorithm.uses_critic else None
    actor = Actor(policy, algo=recipe.algorithm, mem=sysc.memory, dist=dist, micro_batch=micro, temperature=temp)
    ref = Reference(ref_model, mem=sysc.memory, dist=dist, micro_batch=micro, temperature=temp)
    critic = None
    if critic_model is not None:
        critic = Critic(critic_model, algo=recipe.algorithm, mem=sysc.memory, dist=dist, micro_batch=micro)
    backend = sysc.rollout.backend
    if backend == "hf":
        rollout = make_rollout("hf", model=actor.model, device=dev, shares_actor=True, synced=dist.world > 1,
                               **rollout_kwargs(recipe, tokenizer))
    else:
        rollout = make_rollout(backend, recipe=recipe, device=dev, tokenizer=tokenizer, **rollout_kwargs(recipe, tokenizer))
    return Roles(actor=actor, ref=ref, critic=critic, rollout=rollout, reward=build_reward(recipe, task, tokenizer, dev),
                 colocated_rollout=True)
