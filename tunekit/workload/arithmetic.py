"""The embedded workload: integer arithmetic prompts such as ``12+7=`` → ``19`` and a partial-credit reward.

It is one prompt source + reward pair like any user's: ``task.reward`` defaults to :func:`reward` here.
"""

from __future__ import annotations

import random

from tunekit.workload.base import HOLD_OUT_SEED, Prompt, char_match_score, held_count

DATA_SOURCE = "arithmetic"
"""The ``data_source`` a reward is told for a generated prompt."""
EXAMPLES = 64
"""Generated prompts checked before the first probe."""
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticPrompts:
    """Two operands drawn uniformly from ``0..max_operand`` joined by one of ``ops``.

    Subtraction puts the larger operand first, so every answer is a non-negative
    integer written with digits only. The default (addition up to 20) is what the
    embedded tiny model is warmed up on: it starts with partial reward and PPO can
    raise it within a 100-step probe.
    """

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
        """The longest correct answer, in characters (one token each with the embedded tokenizer)."""
        self._held: set[str] = set()

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self._one(rng) for _ in range(n)]

    def hold_out(self, fraction: float) -> list[Prompt]:
        """``fraction`` of the distinct problems, never drawn for training afterwards."""
        every = sorted({p.text: p for p in self._all()}.items())
        k = held_count(len(every), fraction, "distinct arithmetic problems")
        held = [p for _, p in random.Random(HOLD_OUT_SEED).sample(every, k)]
        self._held |= {p.text for p in held}
        return held

    def _all(self) -> list[Prompt]:
        return [self._problem(a, b, op) for a in range(self.max_operand + 1) for b in range(self.max_operand + 1)
                for op in self.ops]

    def examples(self) -> list[Prompt]:
        return self.sample(EXAMPLES, random.Random(0))

    def _one(self, rng: random.Random) -> Prompt:
        while True:  # a held-out problem is drawn again
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            prompt = self._problem(a, b, rng.choice(self.ops))
            if prompt.text not in self._held:
                return prompt

    @staticmethod
    def _problem(a: int, b: int, op: str) -> Prompt:
        if op == "-" and b > a:
            a, b = b, a
        return Prompt(text=f"{a}{op}{b}=", answer=str(_OPS[op](a, b)), data_source=DATA_SOURCE)

    def __repr__(self) -> str:
        return f"ArithmeticPrompts(max_operand={self.max_operand}, ops={self.ops})"


def reward(prompt: str, response: str, answer: str) -> float:
    """The embedded reward: per-character partial credit of ``response`` against ``answer``, in [0, 1]."""
    return char_match_score(answer, response)
