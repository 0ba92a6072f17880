"""The training step as a list of named phases.

The loop talks to roles through a small interface (``logprobs``, ``values``,
``update``, ``generate``, ``sync_weights``, ``score``), so the same code drives
local role objects (spmd: every rank runs this loop on its shard of the batch)
and Ray worker groups (single controller: the driver runs it on the whole batch).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import torch

from tunekit import metrics
from tunekit.metrics import ROLLOUT_TOKENS_PER_S, timing
from tunekit.config import Recipe
from tunekit.placement.dist import Dist
from tunekit.profiler.comm import over_ranks, per_node
from tunekit.profiler.phases import PhaseTimer
from tunekit.rundir import EvalSampleLog, SampleLog
from tunekit.workload.reward import extra_means
from tunekit.workload.seeds import step_rng, step_seed
from tunekit.trainer import algos
from tunekit.trainer.batch import Batch, assemble, encode_prompts, pad_width
from tunekit.workload.chat import PromptFormat, prompt_format


@dataclass
class Roles:
    """Handles to the roles a step needs; ``critic`` is None for GRPO, ``ref`` without a KL penalty."""

    actor: Any
    ref: Any | None
    rollout: Any
    reward: Any
    critic: Any | None = None
    colocated_rollout: bool = True
    """Rollout shares GPUs with training, so it sleeps while training runs."""


class Trainer:
    def __init__(self, recipe: Recipe, roles: Roles, *, tokenizer, task, dist: Dist, timer: PhaseTimer,
                 shard_world: int | None = None, samples: SampleLog | None = None,
                 eval_samples: EvalSampleLog | None = None) -> None:
        """``samples``, ``eval_samples``: where the main rank (or the driver) keeps what the model said in its steps
        (:class:`SampleLog`) and its evaluations (:class:`EvalSampleLog`)."""
        self.r, self.roles, self.tok, self.task, self.dist, self.timer = recipe, roles, tokenizer, task, dist, timer
        self.samples, self.eval_samples = samples, eval_samples
        self.batch_cfg = recipe.system.batch
        self.algo = recipe.algorithm
        # spmd: this process holds 1/world of the batch; single controller: the driver holds all of it
        self.shard_world = shard_world if shard_world is not None else dist.world
        self.rollout_metrics: dict[str, float] = {}
        self.reward_extra: dict[str, tuple[float, int]] = {}
        """What this rank's responses' reward dicts gave beside their scores this step (sum, count per key)."""
        # forwards replayed as CUDA graphs record one graph per batch width: round the widths to a few
        sysc = recipe.system
        self.width_multiple = (sysc.graph_width_multiple
                               if sysc.captures(gpu=dist.device.type == "cuda", world=dist.world) else 1)

    @property
    def recompute_old_logprobs(self) -> bool:
        """Whether the step needs the old policy's logprobs before the update (:attr:`Recipe.recomputes_old_logprobs`)."""
        return self.r.recomputes_old_logprobs

    # ------------------------------------------------------------------ phases

    def sample_prompts(self, step: int) -> list:
        """This rank's prompts, each repeated ``samples_per_prompt`` times (groups stay together)."""
        rng = step_rng(self.r.probe.seed, step)
        prompts = self.task.sample(self.batch_cfg.prompts_per_step, rng)
        per_rank = len(prompts) // self.shard_world
        rank = self.dist.rank if self.shard_world > 1 else 0
        mine = prompts[rank * per_rank : (rank + 1) * per_rank]
        return [p for p in mine for _ in range(self.batch_cfg.samples_per_prompt)]

    @functools.cached_property
    def prompt_format(self) -> PromptFormat:
        return prompt_format(self.r.task, self.tok)

    def prompt_batch(self, prompts: list) -> Batch:
        """The prompts' ids as the model is fed them (through the chat template, ``task.chat_template``), left-padded."""
        return encode_prompts(self.tok, [self.prompt_format.render(self.tok, p.text) for p in prompts])

    def generate(self, prompts: list, step: int) -> Batch:
        """Sample responses; also sets :attr:`rollout_metrics` (what the backend reports)."""
        enc = self.prompt_batch(prompts)
        seed = step_seed(self.r.probe.seed, step * 1000 + self.dist.rank)
        response_ids, rollout_logp = self.roles.rollout.generate(enc, seed=seed)
        batch = pad_width(assemble(enc, response_ids, self.tok.eos_token_id), self.width_multiple,
                          self.tok.pad_token_id)
        if rollout_logp is not None:  # None: the engine was asked for none (system.rollout.logprobs)
            batch["rollout_logprobs"] = rollout_logp
        self.rollout_metrics = dict(getattr(self.roles.rollout, "last_metrics", None) or {})
        return batch

    def responses(self, batch: Batch) -> list[str]:
        """The batch's responses as text."""
        r = batch["response_mask"].shape[1]
        ids = batch["input_ids"][:, -r:]
        # a preset's vocabulary is larger than the embedded tokenizer's: unknown ids decode as pad
        ids = torch.where((ids < len(self.tok)) & (batch["response_mask"] > 0), ids, self.tok.pad_token_id)
        return self.tok.batch_decode(ids, skip_special_tokens=True)

    def score(self, step: int, prompts: list, batch: Batch) -> torch.Tensor:
        """The reward of each response; a step :attr:`samples` keeps is written there too."""
        texts = self.responses(batch)
        scores = self.roles.reward.score(prompts, texts)
        self.reward_extra = dict(getattr(self.roles.reward, "last_extra", None) or {})
        if self.samples is not None and self.samples.wants(step):
            self.samples.add(step, [p.text for p in prompts], texts, [p.answer for p in prompts], scores.tolist())
        return scores

    def evaluate(self, step: int) -> dict[str, float]:
        """After every ``probe.eval_every``-th step: :meth:`evaluation` after ``step + 1`` steps; empty on other
        steps and without held-out prompts."""
        every = self.r.probe.eval_every
        if not self.r.evaluates or (step + 1) % every:
            return {}
        return self.evaluation(step + 1)

    def evaluation(self, trained: int) -> dict[str, float]:
        """Greedy responses to the held-out prompts (``task.eval_fraction`` or ``task.eval_dataset``) after
        ``trained`` steps (0: before the first): their mean reward as ``eval/reward_mean`` and the seconds it took
        as ``eval/time_s``, every response in :attr:`eval_samples` (on the main rank); empty without held-out prompts.

        Each rank (spmd) answers every ``world``-th prompt, in batches of its share of a step's batch (a size every
        backend splits), the last one filled up with repeats that are generated and never scored."""
        prompts = self.task.eval_prompts(self.r.probe.eval_prompts)
        if not prompts:
            return {}
        start = time.perf_counter()
        world = self.shard_world
        rank = self.dist.rank if world > 1 else 0
        mine = prompts[rank::world]
        rows = self.batch_cfg.samples_per_step // world
        per_rank = -(-len(prompts) // world)
        batches = -(-per_rank // rows)  # the same on every rank: generation may be collective
        filled = [(mine or prompts)[i % len(mine or prompts)] for i in range(batches * rows)]
        answered: list[tuple[int, str, str, str | None, float]] = []  # (place in prompts, prompt, response, ...)
        for b in range(batches):
            chunk = filled[b * rows:(b + 1) * rows]
            enc = encode_prompts(self.tok, [p.text for p in chunk])
            response_ids, _ = self.roles.rollout.generate(enc, seed=step_seed(self.r.probe.seed, trained), greedy=True)
            own = max(len(mine) - b * rows, 0)  # the rest repeat prompts to fill the batch: generated, never scored
            if own:
                texts = self.responses(assemble(enc, response_ids, self.tok.eos_token_id))[:own]
                scores = self.roles.reward.score(chunk[:own], texts).tolist()
                answered += [(rank + world * (b * rows + i), p.text, t, p.answer, s)
                             for i, (p, t, s) in enumerate(zip(chunk[:own], texts, scores))]
        mean = self.dist.mean(sum(a[4] for a in answered)) * self.dist.world / len(prompts)
        everyone = sorted(a for part in self.dist.gather(answered) for a in part) if world > 1 else answered
        if self.eval_samples is not None:
            self.eval_samples.add(trained, *zip(*(a[1:] for a in everyone)))
        return {metrics.EVAL_REWARD_MEAN: mean, metrics.EVAL_TIME_S: time.perf_counter() - start}

    def advantages(self, batch: Batch, scores: torch.Tensor) -> None:
        """Fill ``advantages`` (and ``returns`` for PPO) in place.

        With the KL in the reward every token's reward carries -kl_coef x KL (policy before the update vs
        reference); GRPO's group baseline then compares the penalised scores (the token rewards' sums).
        """
        mask = batch["response_mask"]
        kl = (algos.kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], self.algo.kl_kind)
              if self.algo.kl_in_reward else None)
        if self.algo.name == "grpo":
            penalised = scores if kl is None else algos.token_level_rewards(scores, mask, kl, self.algo.kl_coef).sum(-1)
            adv = algos.grpo_advantages(penalised, self.batch_cfg.samples_per_prompt)
            batch["advantages"] = adv[:, None] * mask
            return
        rewards = algos.token_level_rewards(scores, mask, kl, self.algo.kl_coef)
        adv, ret = algos.compute_gae(rewards, batch["old_values"], mask, self.algo.gamma, self.algo.lam)
        batch["returns"] = ret
        batch["advantages"] = self._whiten(adv, mask) if self.algo.whiten_advantages else adv

    def _whiten(self, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Whiten over the global batch (all ranks), so sharding does not change the update."""
        if self.dist.world == 1:
            return algos.masked_whiten(adv, mask)
        return algos.masked_whiten(adv, mask, all_reduce_sum=self._all_reduce_sum)

    def _all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.dist.mean(t) * self.dist.world, dtype=t.dtype)

    def sync_weights(self) -> float:
        """Push the actor's new weights to the rollout engine; returns bytes moved."""
        return float(self.roles.rollout.sync_weights(self.roles.actor.named_full_params()) or 0)

    # ------------------------------------------------------------------ one step

    def step(self, step: int) -> dict[str, float]:
        t, roles = self.timer, self.roles
        mini = self.batch_cfg.mini_batch // self.shard_world
        t.start_step()
        prompts = self.sample_prompts(step)
        with t.phase("gen"):
            batch = self.generate(prompts, step)
            if roles.colocated_rollout and self.r.system.rollout.enable_sleep:
                roles.rollout.sleep()
        # this rank's response tokens over the phase, as TRL's and verl's are read; the ranks' sum below
        self.rollout_metrics[ROLLOUT_TOKENS_PER_S] = (float(batch["response_mask"].sum())
                                                      / max(t.metrics[timing("gen")], 1e-9))
        with t.phase("reward"):
            scores = self.score(step, prompts, batch)
        if roles.ref is not None:
            with t.phase("ref"):
                batch["ref_logprobs"] = roles.ref.logprobs(batch)
        if self.recompute_old_logprobs:
            with t.phase("old_logprob"):
                batch["old_logprobs"] = roles.actor.logprobs(batch)
        if roles.critic is not None:
            with t.phase("values"):
                batch["old_values"] = roles.critic.values(batch)
        with t.phase("adv"):
            self.advantages(batch, scores)
        metrics: dict[str, float] = {}
        if roles.critic is not None:
            with t.phase("update_critic"):
                metrics |= roles.critic.update(batch, mini_batch=mini, seed=step)
        with t.phase("update_actor"):
            metrics |= roles.actor.update(batch, mini_batch=mini, seed=step)
        with t.phase("update_weights"):
            if roles.colocated_rollout and self.r.system.rollout.enable_sleep:
                roles.rollout.wake()
            metrics["rollout/weight_sync_bytes"] = self.sync_weights()
        metrics |= t.end_step()
        if self.dist.world > 1 and "comm/sampled" in metrics:  # every rank samples the same steps
            parts = self.dist.gather((self.dist.node, {k: v for k, v in metrics.items() if k.startswith("comm/")}))
            metrics |= over_ranks(parts) | (per_node(parts) if self.dist.nnodes > 1 else {})
        metrics |= {k: self.dist.mean(v) * (self.dist.world if k == ROLLOUT_TOKENS_PER_S else 1)  # the batch's: a sum
                    for k, v in self.rollout_metrics.items()}  # the engine's readings: per rank → per GPU
        metrics |= self.batch_metrics(batch, scores)
        metrics |= extra_means(self.dist.gather(self.reward_extra))  # a collective: every rank's keys counted
        if "actor/rollout_logprob_abs_diff" in metrics:  # measured inside the update (no old_logprob phase)
            metrics["rollout/logprob_abs_diff_mean"] = self.dist.mean(metrics.pop("actor/rollout_logprob_abs_diff"))
        if "old_logprobs" not in batch and "actor/ref_kl" in metrics:  # likewise, with the KL in the loss
            metrics["actor/ref_kl"] = self.dist.mean(metrics["actor/ref_kl"])
        metrics["step"] = step
        return metrics

    def batch_metrics(self, batch: Batch, scores: torch.Tensor) -> dict[str, float]:
        mask = batch["response_mask"]
        tokens = float(batch["attention_mask"].sum())
        m = {
            "reward/mean": self.dist.mean(scores.mean()),
            "reward/exact": self.dist.mean((scores >= self.r.task.reward_range[1]).float().mean()),
            "response_length/mean": self.dist.mean(mask.sum(-1).float().mean()),
            "perf/total_tokens": self.dist.mean(tokens) * self.dist.world,
        }
        if "old_logprobs" in batch and "rollout_logprobs" in batch:
            m["rollout/logprob_abs_diff_mean"] = self.dist.mean(
                algos.masked_mean((batch["rollout_logprobs"] - batch["old_logprobs"]).abs(), mask))
        if "ref_logprobs" in batch and "old_logprobs" in batch:
            m["actor/ref_kl"] = self.dist.mean(algos.masked_mean(batch["old_logprobs"] - batch["ref_logprobs"], mask))
        return m
