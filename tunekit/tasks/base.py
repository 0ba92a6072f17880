"""What a task is: prompts with a known answer and a rule-based reward in [0, 1]."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Prompt:
    """One question: ``text`` is fed to the model, ``answer`` is what a perfect completion reads."""

    text: str
    answer: str


@runtime_checkable
class Task(Protocol):
    """A prompt source with a verifiable reward.

    ``max_completion_chars`` bounds the length of a correct answer, so a rollout
    can pick ``max_new_tokens`` (plus one for EOS with a character tokenizer).
    """

    max_completion_chars: int

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        """``n`` prompts drawn with ``rng`` (the caller owns the seed)."""
        ...

    def score(self, prompt: Prompt, completion: str) -> float:
        """Reward in [0, 1] for ``completion`` (the text generated up to EOS); 1.0 only if exactly right."""
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
