"""Build the models, task and roles a recipe asks for, in this process.

transformers is imported where a model or tokenizer is built (:mod:`tunekit.workload.models`), so a rule reward's
Ray worker, which builds neither, starts without it.
"""

from __future__ import annotations

import torch

from tunekit.config import Recipe
from tunekit.profiler.startup import StartupClock
from tunekit.trainer.loop import Roles
from tunekit.placement.dist import Dist
from tunekit.trainer.roles.actor import Actor
from tunekit.trainer.roles.critic import Critic
from tunekit.trainer.roles.ref import Reference
from tunekit.trainer.roles.reward import ModelReward, RuleReward
from tunekit.placement.backends import backend_of
from tunekit.trainer.rollout import engine_of


def model_dtype(recipe: Recipe, device: torch.device) -> torch.dtype:
    """Master weights stay fp32 when training on CPU; on GPU bf16 unless the recipe says float32.

    On GPU with FSDP2 the mixed-precision policy computes in bf16 over fp32 masters,
    so ``auto`` keeps fp32 parameters there too.
    """
    if recipe.model.dtype == "bfloat16":
        return torch.bfloat16
    return torch.float32


def replica_dtype(recipe: Recipe, device: torch.device) -> torch.dtype:
    """A rollout replica's weights: bf16 on GPU, as an inference engine holds them; fp32 on CPU or if asked."""
    return torch.float32 if recipe.model.dtype == "float32" or device.type == "cpu" else torch.bfloat16


def build_task(recipe: Recipe):
    """The recipe's workload: prompts (``task.dataset`` or the embedded generator) and ``task.reward``."""
    from tunekit.workload import build_workload

    return build_workload(recipe.task)


def needs_tokenizer(recipe: Recipe, role: str) -> bool:
    """Whether ``role`` reads the tokenizer: every role but a rule reward, which scores the decoded texts."""
    return role != "reward" or bool(recipe.model.reward_model_path)


def load_tokenizer(recipe: Recipe):
    from tunekit.workload import models

    m = recipe.model
    return models.load_tokenizer(m.tokenizer_path or m.path)


def build_policy(recipe: Recipe, tokenizer, device: torch.device | str = "cpu"):
    from tunekit.workload import models

    m = recipe.model
    # presets keep their real vocabulary: the LM head is a large share of a small model's cost
    return models.build_causal_lm(path=m.path, preset=m.preset, vocab_size=None, dtype=model_dtype(recipe, torch.device(device)),
                                  trust_remote_code=m.trust_remote_code, seed=recipe.probe.seed, device=device)


def build_reward(recipe: Recipe, task, tokenizer, device: torch.device):
    if recipe.model.reward_model_path:
        from tunekit.workload import models

        rm = models.RewardModel(recipe.model.reward_model_path, trust_remote_code=recipe.model.trust_remote_code)
        return ModelReward(rm, tokenizer, device)
    return RuleReward(task)


def rollout_kwargs(recipe: Recipe, tokenizer) -> dict:
    t = recipe.task
    return dict(pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, max_new_tokens=t.max_new_tokens,
                temperature=t.temperature, fixed_length=t.fixed_length)


def compiles(recipe: Recipe, dist: Dist) -> bool:
    """Whether this process's roles compile (:meth:`SystemConfig.compiles` on its device and group)."""
    return recipe.system.compiles(gpu=dist.device.type == "cuda", world=dist.world)


def captures(recipe: Recipe, dist: Dist) -> bool:
    """Whether this process's roles replay their compiled passes as CUDA graphs (:meth:`SystemConfig.captures`)."""
    return recipe.system.captures(gpu=dist.device.type == "cuda", world=dist.world)


def build_actor(recipe: Recipe, dist: Dist, policy) -> Actor:
    """The actor around ``policy`` (sharded in place: copy the reference and critic first)."""
    sysc = recipe.system
    return Actor(policy, algo=recipe.algorithm, mem=sysc.memory, dist=dist, micro_batch=sysc.batch.micro_batch,
                 temperature=recipe.task.temperature, max_response_tokens=recipe.task.max_new_tokens,
                 compile=compiles(recipe, dist), cuda_graphs=captures(recipe, dist))


def build_ref(recipe: Recipe, dist: Dist, policy) -> Reference:
    """A frozen copy of the initial ``policy``."""
    from tunekit.workload import models

    sysc = recipe.system
    return Reference(models.build_reference(policy), mem=sysc.memory, dist=dist, micro_batch=sysc.batch.micro_batch,
                     temperature=recipe.task.temperature, compile=compiles(recipe, dist),
                     cuda_graphs=captures(recipe, dist))


def build_critic(recipe: Recipe, dist: Dist, policy) -> Critic:
    """A critic whose backbone is a copy of the initial ``policy``'s."""
    from tunekit.workload import models

    sysc = recipe.system
    return Critic(models.CriticModel.from_actor(policy), algo=recipe.algorithm, mem=sysc.memory, dist=dist,
                  micro_batch=sysc.batch.micro_batch, compile=compiles(recipe, dist), cuda_graphs=captures(recipe, dist))


def rollout_engine_dir(recipe: Recipe, dist: Dist, tokenizer, policy=None):
    """The checkpoint a vLLM engine (or a server tunekit starts) loads; None when none is needed.

    Give the initial ``policy`` before the actor shards it (a preset's random weights are
    saved from it); without it a preset policy is rebuilt, identical for the same seed.
    """
    rc = recipe.system.rollout
    if not backend_of(rc).needs_checkpoint(rc):
        return None
    from tunekit.trainer.rollout.checkpoint import rollout_checkpoint

    if policy is None and recipe.model.preset:
        policy = build_policy(recipe, tokenizer)
    return rollout_checkpoint(recipe, policy, tokenizer, dist)


def build_rollout(recipe: Recipe, dist: Dist, tokenizer, model=None, *, shares_actor: bool = False,
                  engine_dir=None, run_dir=None):
    """The rollout engine; for ``hf``, ``model`` is the actor's own module or a copy synced each step.

    For vLLM backends ``engine_dir`` is :func:`rollout_engine_dir` (made here when not given);
    a server tunekit starts logs to ``run_dir``.
    """
    spec = backend_of(recipe.system.rollout)
    if spec.generates_with_policy:
        return engine_of(recipe.system.rollout)(model=model, device=dist.device, shares_actor=shares_actor,
                                                synced=shares_actor and dist.world > 1, **rollout_kwargs(recipe, tokenizer))
    if engine_dir is None:
        engine_dir = rollout_engine_dir(recipe, dist, tokenizer)
    extra = {} if spec.in_trainer_ranks else {"run_dir": run_dir}  # a process tree of its own logs there
    return engine_of(recipe.system.rollout)(recipe=recipe, device=dist.device, tokenizer=tokenizer, model_dir=engine_dir,
                                            **extra, **rollout_kwargs(recipe, tokenizer))


def build_role(recipe: Recipe, role: str, dist: Dist, tokenizer, task):
    """One role in this process (a single-controller worker); each builds its own copy of the initial policy."""
    torch.manual_seed(recipe.probe.seed)
    if role == "reward":
        return build_reward(recipe, task, tokenizer, dist.device)
    if role == "rollout" and not backend_of(recipe.system.rollout).generates_with_policy:
        return build_rollout(recipe, dist, tokenizer)
    policy = build_policy(recipe, tokenizer)
    if role == "rollout":
        # a plain replica, not sharded: on GPU it generates in bf16 like an inference engine would
        return build_rollout(recipe, dist, tokenizer, policy.to(dist.device, replica_dtype(recipe, dist.device)))
    builders = {"actor": build_actor, "ref": build_ref, "critic": build_critic}
    return builders[role](recipe, dist, policy)


def build_local_roles(recipe: Recipe, dist: Dist, tokenizer, task, run_dir=None,
                      clock: StartupClock | None = None) -> Roles:
    """Every role in this process (spmd: colocated on this rank's device); ``clock`` times the model load (the
    policy, its engine checkpoint, the roles' copies on the device) and the rollout engine's start."""
    clock = clock or StartupClock()
    torch.manual_seed(recipe.probe.seed)
    with clock.part("model_load"):
        policy = build_policy(recipe, tokenizer)
        engine_dir = rollout_engine_dir(recipe, dist, tokenizer, policy)
        # the reference and critic copy the initial policy before the actor shards it
        ref = build_ref(recipe, dist, policy) if recipe.algorithm.uses_ref else None
        critic = build_critic(recipe, dist, policy) if recipe.algorithm.uses_critic else None
        actor = build_actor(recipe, dist, policy)
    with clock.part("engine_start"):
        rollout = build_rollout(recipe, dist, tokenizer, actor.model, shares_actor=True, engine_dir=engine_dir,
                                run_dir=run_dir)
    return Roles(actor=actor, ref=ref, critic=critic, rollout=rollout,
                 reward=build_reward(recipe, task, tokenizer, dist.device), colocated_rollout=True)
