"""A task an instruct model learns: two-operand arithmetic asked in words ("What is 12 + 7? Reply with only the
number."), and a reward for the final number of the answer.

The questions are every sum of two operands in ``0..MAX_OPERAND`` and every difference with the larger operand first
(a non-negative answer), in one fixed shuffled order: :func:`rows` always gives the same table, which tunekit writes
once into its cache as the shipped dataset ``tunekit:arith-qa`` (:mod:`tunekit.workload.shipped`).
"""

from __future__ import annotations

import random
import re

MAX_OPERAND = 50
QUESTION = "What is {a} {op} {b}? Reply with only the number."
_INTEGER = re.compile(r"-?\d+")


def rows() -> list[dict[str, str]]:
    """Every question with its answer (``prompt``, ``answer``), shuffled by a fixed seed."""
    out = [{"prompt": QUESTION.format(a=a, op="+", b=b), "answer": str(a + b)}
           for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    out += [{"prompt": QUESTION.format(a=a, op="-", b=b), "answer": str(a - b)}
            for a in range(MAX_OPERAND + 1) for b in range(a + 1)]
    random.Random(0).shuffle(out)
    return out


def final_number(response: str) -> int | None:
    """The last integer the response writes ("12 + 7 = 19" gives 19), or None."""
    found = _INTEGER.findall(response.replace(",", ""))
    return int(found[-1]) if found else None


def reward(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response's last integer is the answer, else 0.0: the mean reward is the exact-answer rate."""
    return float(final_number(response) == int(answer))
