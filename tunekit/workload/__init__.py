"""The workload every runner trains on: where prompts come from (``task.dataset``, or the embedded arithmetic
generator) and the reward that scores a response (``task.reward``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tunekit.config import TaskConfig
from tunekit.errors import ConfigError
from tunekit.seeds import step_rng
from tunekit.workload.arithmetic import ArithmeticPrompts
from tunekit.workload.base import Prompt, PromptSource, RewardFn, char_match_score
from tunekit.workload.dataset import DatasetPrompts, read_table
from tunekit.workload.reward import import_reward, load_reward

__all__ = ["ArithmeticPrompts", "DatasetPrompts", "Prompt", "PromptSource", "RewardFn", "Workload", "build_workload",
           "char_match_score", "check_workload", "import_reward", "load_reward"]

DRY_ROWS = 4
"""Rows the reward is called on before the first probe (with each row's answer as the response)."""


@dataclass
class Workload:
    """Prompts and the reward that scores them."""

    prompts: PromptSource
    reward: RewardFn

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return self.prompts.sample(n, rng)

    def score(self, prompt: Prompt, completion: str) -> float:
        return self.reward(prompt.text, completion, prompt.answer)

    def probe_prompts(self, per_step: int, steps: int, seed: int) -> list[Prompt]:
        """The prompts tunekit's own loop samples at each of ``steps`` steps, in step order: what a framework
        runner feeds its trainer unshuffled, so every runner trains on the same prompts for a seed."""
        return [p for step in range(steps) for p in self.sample(per_step, step_rng(seed, step))]


def build_prompts(task: TaskConfig) -> PromptSource:
    if task.dataset is None:
        return ArithmeticPrompts(max_operand=task.max_operand)
    return DatasetPrompts(read_table(task.dataset), prompt_column=task.prompt_column, answer_column=task.answer_column,
                          template=task.prompt_template, source=f"task.dataset {task.dataset!r}")


def build_workload(task: TaskConfig) -> Workload:
    """The recipe's workload; a bad file or reward raises ConfigError (:func:`check_workload` says it first)."""
    return Workload(build_prompts(task), load_reward(task.reward, task.dataset))


def check_workload(task: TaskConfig) -> None:
    """Before the first probe: the file reads, has its columns and rows, and the reward, called on a few rows
    (the answer as the response), returns a number. Raises ConfigError naming the key."""
    workload = build_workload(task)
    for prompt in workload.sample(DRY_ROWS, random.Random(0)):
        try:
            workload.score(prompt, prompt.answer)
        except Exception as e:  # noqa: BLE001 - whatever the user's function raises is reported
            raise ConfigError(f"task.reward {task.reward!r} failed on the prompt {prompt.text[:60]!r} "
                              f"({type(e).__name__}: {str(e)[:160]}); fix the function so it returns a float.") from None
