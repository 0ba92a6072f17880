"""How a probe's seed becomes the seed of one draw (a step's prompts, a step's responses), so every runner and
backend draws the same prompts and samples for the same seed."""

from __future__ import annotations

import random

_MIX = 1_000_003  # a prime larger than any step count: (seed, step) pairs never collide


def step_seed(seed: int, step: int) -> int:
    """The seed of draw ``step`` of a probe seeded ``seed``."""
    return seed * _MIX + step


def step_rng(seed: int, step: int) -> random.Random:
    """The generator that picks step ``step``'s prompts."""
    return random.Random(step_seed(seed, step))
