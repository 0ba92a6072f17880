"""Embedded prompt sets with verifiable rewards. The name → class map is :data:`TASKS`."""

from __future__ import annotations

from typing import Any

from tunekit.tasks.arithmetic import ArithmeticTask
from tunekit.tasks.base import Prompt, Task, char_match_score

TASKS = {"arithmetic": ArithmeticTask}

__all__ = ["TASKS", "ArithmeticTask", "Prompt", "Task", "char_match_score", "make_task"]


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task called ``name`` with its keyword arguments; unknown names raise ValueError."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)
