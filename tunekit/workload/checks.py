"""The workload's checks before the first probe: every prompt survives the tokenizer, and the reward gives a finite
number in ``task.reward_range`` for right, wrong, empty and long responses. Each failure is one ConfigError
sentence; nothing has been written yet."""

from __future__ import annotations

import random
import unicodedata
from collections import Counter, defaultdict

from tunekit.config.errors import ConfigError
from tunekit.workload.base import Prompt
from tunekit.workload.reward import RewardError, UserReward

MAX_LOST = 0.05
"""Largest share of a prompt's characters (whitespace aside) its tokenizer may fail to give back on decoding."""
REWARD_ROWS = 16
"""Rows the reward is tried on at least (every row of a smaller file)."""
MAX_SOURCES = 64
"""``data_source`` values that each get a row of their own in the reward check, at most."""
LONG_CHARS = 4096
"""Length of the long response the reward is tried on."""


def lost_share(text: str, decoded: str) -> float:
    """Share of ``text``'s characters (whitespace aside, compared after Unicode normalisation and case folding)
    that ``decoded`` does not give back."""
    def chars(s: str) -> Counter:
        return Counter(c for c in unicodedata.normalize("NFKC", s).casefold() if not c.isspace())

    want = chars(text)
    total = sum(want.values())
    return sum((want - chars(decoded)).values()) / total if total else 0.0


def check_prompts(prompts: list[Prompt], tokenizer, *, tokenizer_name: str, source: str) -> None:
    """Each prompt encodes to at least one token and decodes with at most :data:`MAX_LOST` of its characters lost."""
    texts = [p.text for p in prompts]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    decoded = tokenizer.batch_decode(ids, skip_special_tokens=True) if texts else []
    fix = ("give a tokenizer that covers the text: model.path or model.preset of a real model (or "
           "model.tokenizer_path), or rewrite the prompts")
    for p, tokens, back in zip(prompts, ids, decoded):
        if not tokens:
            raise ConfigError(f"{source}: {p.where()} encodes to no tokens with {tokenizer_name}; {fix}.")
        lost = lost_share(p.text, back)
        if lost > MAX_LOST:
            raise ConfigError(f"{source}: {p.where()} loses {lost:.0%} of its characters through "
                              f"{tokenizer_name} (it decodes to {back[:40]!r}); {fix}.")


def reward_rows(prompts: list[Prompt], seed: int = 0) -> list[Prompt]:
    """At least :data:`REWARD_ROWS` prompts (all of fewer), one from each ``data_source`` first (up to
    :data:`MAX_SOURCES` of them), then round-robin over the sources."""
    if len(prompts) <= REWARD_ROWS:
        return list(prompts)
    rng = random.Random(seed)
    groups: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        groups[p.data_source].append(p)
    order = list(groups.values())
    rng.shuffle(order)
    for g in order:
        rng.shuffle(g)
    picked: list[Prompt] = [g.pop() for g in order[:MAX_SOURCES]]
    while len(picked) < REWARD_ROWS:
        for g in order:
            if g and len(picked) < REWARD_ROWS:
                picked.append(g.pop())
    return picked


def trial_responses(prompt: Prompt, others: list[Prompt]) -> dict[str, str]:
    """The responses the reward is tried on: the right answer, a wrong one (another row's answer, or a changed
    copy), an empty one and a long one."""
    wrong = next((o.answer for o in others if o.answer.strip() != prompt.answer.strip()), None)
    if wrong is None:
        wrong = f"not {prompt.answer}" if prompt.answer else "no"
    filler = f"Let me think step by step. {prompt.text} {wrong} "
    long = (filler * (LONG_CHARS // max(len(filler), 1) + 1))[:LONG_CHARS - len(prompt.answer)] + prompt.answer
    return {"the right answer": prompt.answer, "a wrong answer": wrong, "an empty response": "", "a long response": long}


def check_reward(reward: UserReward, prompts: list[Prompt], reward_range: tuple[float, float]) -> None:
    """The reward on :func:`reward_rows` x :func:`trial_responses`: a finite number inside ``reward_range`` each."""
    rows = reward_rows(prompts)
    low, high = reward_range
    for p in rows:
        for response in trial_responses(p, rows).values():
            try:
                score = reward(p, response)
            except RewardError as e:
                raise ConfigError(e.message) from None
            if not low <= score.value <= high:
                raise ConfigError(reward.sentence(
                    p, response, f"returned {score.value:g}, outside task.reward_range [{low:g}, {high:g}]",
                    "set task.reward_range to the lowest and highest reward the function gives, or fix the function"))
