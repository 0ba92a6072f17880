"""The workload every runner trains on: where prompts come from (``task.dataset``, or the embedded arithmetic
generator) and the reward that scores a response (``task.reward``)."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

from tunekit.config import TaskConfig
from tunekit.config.errors import ConfigError
from tunekit.workload.seeds import step_rng
from tunekit.workload.arithmetic import ArithmeticPrompts
from tunekit.workload.base import Prompt, PromptSource, char_match_score
from tunekit.workload.chat import prompt_format, say_once
from tunekit.workload.checks import check_prompts, check_reward
from tunekit.workload.dataset import DatasetPrompts, evaluation_prompts, read_table
from tunekit.workload.shipped import data_source, dataset_file
from tunekit.workload.reward import (RewardError, Score, UserReward, import_reward, import_root, load_reward,
                                     takes_verl_args)

__all__ = ["ArithmeticPrompts", "DatasetPrompts", "Prompt", "PromptSource", "RewardError", "Score", "UserReward",
           "Workload", "build_workload", "char_match_score", "check_workload", "import_reward", "import_root", "load_reward",
           "prompt_source_name", "takes_verl_args"]


@dataclass
class Workload:
    """Prompts and the reward that scores them."""

    prompts: PromptSource
    reward: UserReward
    held_out: list[Prompt] = field(default_factory=list)
    """The prompts evaluation reads: those ``task.eval_fraction`` keeps out of training, or ``task.eval_dataset``'s."""

    def eval_prompts(self, limit: int) -> list[Prompt]:
        """The held-out prompts an evaluation reads (at most ``limit``, the same every time)."""
        return self.held_out[:limit]

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return self.prompts.sample(n, rng)

    def score(self, prompt: Prompt, completion: str) -> float:
        """The reward of one response; a :class:`RewardError` when the function raises or gives no finite number."""
        return self.reward(prompt, completion).value

    def scores(self, prompts: list[Prompt], completions: list[str]) -> list[Score]:
        """Every response's :class:`Score` (its dict return's other numbers included)."""
        return [self.reward(p, c) for p, c in zip(prompts, completions)]

    def probe_prompts(self, per_step: int, steps: int, seed: int) -> list[Prompt]:
        """The prompts tunekit's own loop samples at each of ``steps`` steps, in step order: what a framework
        runner feeds its trainer unshuffled, so every runner trains on the same prompts for a seed."""
        return [p for step in range(steps) for p in self.sample(per_step, step_rng(seed, step))]


def prompt_source_name(task: TaskConfig) -> str:
    """Where the prompts come from, as an error sentence names it."""
    return f"task.dataset {task.dataset!r}" if task.dataset else "the embedded arithmetic prompts (task.dataset unset)"


def build_prompts(task: TaskConfig) -> PromptSource:
    if task.dataset is None:
        return ArithmeticPrompts(max_operand=task.max_operand)
    return DatasetPrompts(read_table(dataset_file(task.dataset)), prompt_column=task.prompt_column,
                          answer_column=task.answer_column, template=task.prompt_template,
                          source=prompt_source_name(task), data_source=data_source(task.dataset))


def eval_file_prompts(task: TaskConfig) -> list[Prompt]:
    """The prompts of ``task.eval_dataset`` (read with ``task.dataset``'s columns and template) as held-out
    prompts (:func:`~tunekit.workload.dataset.evaluation_prompts`)."""
    source = f"task.eval_dataset {task.eval_dataset!r}"
    rows = read_table(dataset_file(task.eval_dataset, key="task.eval_dataset"), key="task.eval_dataset")
    prompts = DatasetPrompts(rows, prompt_column=task.prompt_column, answer_column=task.answer_column,
                             template=task.prompt_template, source=source, data_source=data_source(task.eval_dataset))
    return evaluation_prompts(prompts.prompts)


LENGTH_ROWS = 4096
"""Rows of a dataset :func:`longest_prompt_tokens` reads: enough for a length that holds for the rest, few enough to
tokenize in a second."""


def longest_prompt_tokens(task: TaskConfig, tokenizer, limit: int = LENGTH_ROWS) -> int:
    """The most tokens one of ``task``'s dataset prompts takes as the model is fed it (through ``task.chat_template``,
    tokenized as tunekit's loop tokenizes it): the longest of the first ``limit`` rows."""
    fmt = prompt_format(task, tokenizer)
    texts = [fmt.render(tokenizer, p.text) for p in build_prompts(task).examples()[:limit]]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def held_out_count(task: TaskConfig, limit: int) -> int:
    """How many held-out prompts an evaluation scores, in every runner: at most ``limit`` (``probe.eval_prompts``) of
    the held-out ones (``task.eval_fraction`` or ``task.eval_dataset``: :meth:`Workload.eval_prompts`); read once per
    process per task."""
    return _held_out_count(task.model_dump_json(), limit)


@functools.lru_cache(maxsize=8)
def _held_out_count(task_json: str, limit: int) -> int:
    return len(build_workload(TaskConfig.model_validate_json(task_json)).eval_prompts(limit))


def build_workload(task: TaskConfig) -> Workload:
    """The recipe's workload; a bad file or reward raises ConfigError (:func:`check_workload` says it first)."""
    prompts = build_prompts(task)
    held = (eval_file_prompts(task) if task.eval_dataset is not None else
            prompts.hold_out(task.eval_fraction) if task.eval_fraction else [])
    return Workload(prompts, load_reward(task.reward, prompt_source_name(task)), held)


def check_workload(task: TaskConfig, tokenizer=None, tokenizer_name: str = "the tokenizer") -> None:
    """Before the first probe: the file reads and has its columns and rows; every prompt survives ``tokenizer``
    (when given); the reward gives a finite number inside ``task.reward_range`` for right, wrong, empty and long
    responses on a sample of rows; an evaluation file (``task.eval_dataset``) holds prompts the model does not
    train on (all of them trained on is refused; some, said once). Raises ConfigError naming the key."""
    workload = build_workload(task)
    examples = workload.prompts.examples()
    if task.eval_dataset is not None:  # the evaluation file's prompts are fed and scored too
        trained = {p.text for p in examples}
        shared = sum(p.text in trained for p in workload.held_out)
        if shared == len(workload.held_out):
            raise ConfigError(f"task.eval_dataset {task.eval_dataset!r}: each of its {shared} prompts is also one of "
                              f"{prompt_source_name(task)}, so its reward would read training prompts, not held-out "
                              "ones; give prompts the model does not train on.")
        if shared:
            say_once(f"{shared} of the {len(workload.held_out)} prompts of task.eval_dataset are also in "
                     f"{prompt_source_name(task)}: they are trained on, and their answers count in eval/reward_mean")
        examples = examples + workload.held_out
    if tokenizer is not None:
        check_prompts(examples, tokenizer, tokenizer_name=tokenizer_name, source=prompt_source_name(task))
    check_reward(workload.reward, examples, task.reward_range)
