"""What a finished probe says to the search: its reward with an interval, the full run's length, its price.

One reading serves the trials and the confirmation round alike.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from tunekit import metrics
from tunekit.estimate import cold_start, cost
from tunekit.config import Recipe, effect_of, what_runs
from tunekit.estimate.profiles import PriceProfile
from tunekit.config.errors import TunekitError
from tunekit.rundir import read_config, read_steps
from tunekit.search.verdict import Interval, Measured, Verdict, held_out_interval, reward_interval, verdict
from tunekit.workload import held_out_count


@dataclass(frozen=True)
class Reading:
    """A probe that ended ok, read for the search."""

    rewards: list[float]
    """The training batch's reward of every step (what the learning checks compare)."""
    reward: Interval
    """Mean of ``search.reward_metric`` over the last ``search.reward_window`` steps, with its interval (Student's t over the steps)."""
    length: cost.RunLength
    yuan: float | None
    """Projected yuan of the full run; None when its length is unknown."""
    measured: Measured | None
    """The projection's parts, for paired ratios; None when the run length is unknown."""
    curve: list[float] = field(default_factory=list)
    """``search.reward_metric`` at every step (:func:`tunekit.metrics.reward_curve`): what the verdict reads."""
    window: list[float] = field(default_factory=list)
    """What ``reward``'s interval is taken over (:func:`reward_window`)."""

    def verdict(self, threshold: float) -> Verdict:
        """The reward verdict, and ``infeasible`` whatever the reward when the run length is unknown."""
        return verdict(self.reward, threshold) if self.length.steps is not None else "infeasible"


def learning_key(recipe: Recipe) -> str:
    """A short digest of every key that changes learning, plus the seed: two probes with the same key draw the
    same reward curve unless a systems knob changed learning. A key at its default is left out, so a key that a later
    tunekit adds at its default leaves the digest as it was, and a study resumed under it still finds the learning
    of its earlier trials."""
    defaults = _learning_defaults()
    keys = {k: v for k, v in what_runs(recipe).items() if effect_of(k) == "learning" and (k, v) not in defaults.items()}
    return hashlib.sha1(json.dumps(keys | {"probe.seed": recipe.probe.seed}, sort_keys=True, default=str).encode()
                        ).hexdigest()[:16]


@functools.cache
def _learning_defaults() -> dict[str, Any]:
    return what_runs(Recipe())


def trial_learning_key(user_attrs: Mapping[str, Any]) -> str | None:
    """A finished trial's learning key by this version's rule, read off the recipe its probe recorded
    (``run_dir``'s config.yaml), so that a study resumed under a later version compares its trials like with like;
    the key the trial stored where that recipe cannot be read."""
    recorded = _recorded_learning_key(str(user_attrs["run_dir"])) if user_attrs.get("run_dir") else None
    return recorded or user_attrs.get("learning_key")


@functools.cache
def _recorded_learning_key(run_dir: str) -> str | None:
    try:
        return learning_key(read_config(Path(run_dir)))
    except (OSError, ValueError, TunekitError):
        return None


def reward_window(steps, recipe: Recipe) -> list[float]:
    """The values a probe's reward interval is taken over (:func:`tunekit.metrics.window_values` of
    ``search.reward_metric`` over ``search.reward_window`` steps)."""
    return metrics.window_values(steps, recipe.search.reward_metric, recipe.search.reward_window)


def reward_of(recipe: Recipe, windows: list[list[float]]) -> Interval:
    """The reward with its interval over one window a seed (:func:`reward_window`): Student's t over the steps for the
    training batch's reward, the held-out prompts' Wilson score interval for ``eval/reward_mean``
    (:mod:`tunekit.search.verdict`)."""
    if recipe.search.reward_metric == metrics.EVAL_REWARD_MEAN:
        prompts = held_out_count(recipe.task, recipe.probe.eval_prompts)
        return held_out_interval(windows, prompts, recipe.task.reward_range)
    return reward_interval(windows, recipe.task.reward_range)


def rewards_of(run_dir: str | Path | None) -> list[float]:
    if not run_dir or not Path(run_dir).is_dir():
        return []
    steps = read_steps(Path(run_dir))
    return steps[metrics.REWARD_MEAN].tolist() if metrics.REWARD_MEAN in steps else []


def read_probe(recipe: Recipe, run_dir: Path, summary: dict[str, Any], profile: PriceProfile,
               length: cost.RunLength | None = None) -> Reading:
    """Read an ok probe; ``length`` overrides the run length its own curve gives (a systems variant inherits it)."""
    steps = read_steps(run_dir)
    rewards = steps[metrics.REWARD_MEAN].tolist()
    s = recipe.search
    curve = metrics.reward_curve(steps, s.reward_metric)
    length = length or cost.recipe_run_length(recipe, curve)
    window = reward_window(steps, recipe)
    reward = reward_of(recipe, [window])
    if length.steps is None:
        return Reading(rewards, reward, length, None, None, curve, window)
    gpus = recipe.system.world_size
    # the one-time cost the launcher priced the run with: a cold start's (tunekit.estimate.cold_start)
    proj = cost.project_probe(steps, wall_s=float(summary.get("wall_s", 0.0)), startup_s=float(summary.get("startup_s", 0.0)),
                              warmup_steps=recipe.probe.warmup_steps, target_steps=length.steps, gpus_held=gpus, profile=profile,
                              overhead_s=summary.get(cold_start.PRICED), eval_every=recipe.probe.eval_every)
    measured = Measured(fixed_s=proj.paid_s, steady_s=list(proj.steady_s), rest_steps=proj.rest_steps, gpus=gpus)
    return Reading(rewards, reward, length, proj.yuan, measured, curve, window)
