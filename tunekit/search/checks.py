"""What a search checks of its arguments and recipe before it imports the trainer or creates anything.

The command line calls :func:`check_arguments` first, so a refused search answers in about a second; ``make_setup``
calls it again for callers of the library.
"""

from __future__ import annotations

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.search import space


def check_arguments(recipe: Recipe, budget_yuan: float, trials: int, source: str) -> None:
    """The budget, the trial count, the threshold, the confirmation round and the space; ConfigError if any is wrong."""
    if not budget_yuan > 0:
        raise ConfigError(f"--budget-yuan {budget_yuan:g}: the probe budget must be > 0 yuan, e.g. --budget-yuan 200.")
    if trials < 1:
        raise ConfigError(f"--trials {trials}: a search needs at least 1 trial.")
    if (n := len(recipe.search.references)) and trials < n + 2:
        raise ConfigError(f"--trials {trials}: {source} has {n} search.references, each one of the trials; give "
                          f"--trials {n + 2} or more so the search probes a configuration of its own.")
    _check_verdict_keys(recipe, trials, source)
    space.check_space(recipe, source)


def _check_verdict_keys(recipe: Recipe, trials: int, source: str) -> None:
    """A threshold the reward can reach, and a confirmation round the trials can fill."""
    s, (low, high) = recipe.search, recipe.task.reward_range
    if not low <= s.reward_threshold <= high:
        raise ConfigError(f"{source}: search.reward_threshold {s.reward_threshold:g} is outside the task's reward range "
                          f"[{low:g}, {high:g}] (task.reward_range), so no configuration can reach it; pick a threshold inside it.")
    if s.confirm_top > trials:
        raise ConfigError(f"{source}: search.confirm_top {s.confirm_top} is larger than --trials {trials}; confirm at most as many "
                          "candidates as there are trials (or 0 for no confirmation round).")
