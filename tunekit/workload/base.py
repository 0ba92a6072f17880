"""What a workload is made of: prompts with a known answer, and a reward that scores a response."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Prompt:
    """One question: ``text`` is fed to the model, ``answer`` is what a perfect completion reads.

    What verl's reward contract hands a reward besides: ``data_source`` (the row's ``data_source`` column, else the
    file's name) and ``extra_info`` (the row's other columns, plus its ``index`` and ``split``); ``row`` is the
    row's position in ``task.dataset`` (None for a generated prompt).
    """

    text: str
    answer: str
    data_source: str = ""
    extra_info: Mapping[str, Any] = field(default_factory=dict, compare=False)
    row: int | None = None

    def where(self) -> str:
        """The prompt as an error sentence names it."""
        at = f"row {self.row}" if self.row is not None else "the prompt"
        return f"{at} ({self.text[:60]!r})"


@runtime_checkable
class PromptSource(Protocol):
    """Where a step's prompts come from: a dataset file or a generator."""

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        """``n`` prompts drawn with ``rng`` (the caller owns the seed)."""
        ...

    def examples(self) -> list[Prompt]:
        """The prompts checked before the first probe: every row of a file, a sample of a generator's."""
        ...

    def hold_out(self, fraction: float) -> list[Prompt]:
        """Take ``fraction`` of the prompts out of what :meth:`sample` draws and return them (at least one), the
        same ones on every call of a fresh source: the held-out prompts evaluation reads."""
        ...


HOLD_OUT_SEED = 20_250_611
"""Seeds the choice of held-out prompts: the same rows for every probe seed, so evaluations compare."""


def held_count(total: int, fraction: float, what: str) -> int:
    """How many of ``total`` prompts ``fraction`` holds out: at least one, and never all (ConfigError)."""
    from tunekit.config.errors import ConfigError

    k = max(1, round(total * fraction))
    if k >= total:
        held = "the only prompt" if total == 1 else f"all {total} {what}"
        raise ConfigError(f"task.eval_fraction {fraction:g} holds out {held}, leaving none to train on; "
                          "lower it or give more prompts.")
    return k


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
