"""The prompts a load test sends: the recipe's workload, as tunekit's trainer renders them, or one text given."""

from __future__ import annotations

import random

from tunekit.config import Recipe
from tunekit.workload import build_workload


def prompt_texts(recipe: Recipe, *, text: str | None = None) -> list[str]:
    """``loadtest.prompts`` prompts drawn from the recipe's workload with its seed (``text`` alone when given)."""
    if text is not None:
        return [text]
    workload = build_workload(recipe.task)
    return [p.text for p in workload.sample(recipe.loadtest.prompts, random.Random(recipe.probe.seed))]
