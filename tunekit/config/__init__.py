"""The recipe: pydantic models that are the one home of every default.

A recipe YAML only overrides these defaults; unknown keys and wrong types are
errors that name the file and the key. ``--set dotted.key=value`` overrides are
applied to the raw mapping before validation, so they are checked the same way.
"""

from tunekit.config.base import LEARNING, PROMPT_TOKEN_BUDGET, RECIPES_DIR, ROLES, SYSTEMS, Effect, RunnerName, Strict
from tunekit.config.load import (apply_overrides, dump_recipe, effect_of, list_keys, load_raw, load_recipe, recipe_path,
                                 validate, what_runs)
from tunekit.config.loadtest import LoadtestConfig
from tunekit.config.recipe import (AlgorithmConfig, ModelConfig, ProbeConfig, ProfilerConfig, Recipe, RunConfig,
                                   SearchConfig, SearchParam, SearchReference, TaskConfig)
from tunekit.config.system import BatchConfig, MemoryConfig, RolloutConfig, SystemConfig, serving_key

__all__ = [
    "LEARNING", "PROMPT_TOKEN_BUDGET", "RECIPES_DIR", "ROLES", "SYSTEMS", "AlgorithmConfig", "BatchConfig", "Effect", "LoadtestConfig",
    "MemoryConfig", "ModelConfig", "ProbeConfig", "ProfilerConfig", "Recipe", "RolloutConfig", "RunConfig",
    "RunnerName", "SearchConfig", "SearchParam", "SearchReference", "Strict", "SystemConfig", "TaskConfig", "apply_overrides",
    "dump_recipe", "effect_of", "list_keys", "load_raw", "load_recipe", "recipe_path", "serving_key", "validate", "what_runs",
]
