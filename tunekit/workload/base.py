"""What a workload is made of: prompts with a known answer, and a reward that scores a response."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

RewardFn = Callable[[str, str, str], float]
"""``reward(prompt, response, answer) -> float``: the prompt as fed to the model, the generated text, the row's answer."""


@dataclass(frozen=True)
class Prompt:
    """One question: ``text`` is fed to the model, ``answer`` is what a perfect completion reads."""

    text: str
    answer: str


@runtime_checkable
class PromptSource(Protocol):
    """Where a step's prompts come from: a dataset file or a generator."""

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        """``n`` prompts drawn with ``rng`` (the caller owns the seed)."""
        ...


def char_match_score(answer: str, completion: str) -> float:
    """Partial credit: share of positions where ``completion`` matches ``answer``.

    Both are compared left-aligned after stripping whitespace; dividing by the
    longer length penalises missing and extra characters alike. 1.0 only for an
    exact match, 0.0 for an empty completion.
    """
    got = completion.strip()
    if got == answer:
        return 1.0
    if not got:
        return 0.0
    matches = sum(a == b for a, b in zip(got, answer))
    return matches / max(len(got), len(answer))
