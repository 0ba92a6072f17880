"""Integer arithmetic prompts such as ``12+7=`` → ``19``, scored with per-character partial credit."""

from __future__ import annotations

import random

from tunekit.tasks.base import Prompt, char_match_score

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask:
    """Two operands drawn uniformly from ``0..max_operand`` joined by one of ``ops``.

    Subtraction puts the larger operand first, so every answer is a non-negative
    integer written with digits only. The default (addition up to 20) is what the
    embedded tiny model is warmed up on: it starts with partial reward and PPO can
    raise it within a 100-step probe.
    """

    name = "arithmetic"

    def __init__(self, max_operand: int = 20, ops: tuple[str, ...] | list[str] = ("+",)) -> None:
        if max_operand < 1:
            raise ValueError(f"arithmetic max_operand must be at least 1, got {max_operand}")
        bad = [op for op in ops if op not in _OPS]
        if bad or not ops:
            raise ValueError(f"arithmetic ops must be a non-empty subset of {sorted(_OPS)}, got {list(ops)}")
        self.max_operand = max_operand
        self.ops = tuple(ops)
        largest = max(_OPS[op](max_operand, max_operand) for op in self.ops)
        self.max_completion_chars = len(str(largest))

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self._one(rng) for _ in range(n)]

    def score(self, prompt: Prompt, completion: str) -> float:
        return char_match_score(prompt.answer, completion)

    def _one(self, rng: random.Random) -> Prompt:
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        op = rng.choice(self.ops)
        if op == "-" and b > a:
            a, b = b, a
        return Prompt(text=f"{a}{op}{b}=", answer=str(_OPS[op](a, b)))

    def __repr__(self) -> str:
        return f"ArithmeticTask(max_operand={self.max_operand}, ops={self.ops})"
