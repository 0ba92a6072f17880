"""The user's ``task.reward`` as verl's custom reward function.

verl loads ``compute_score`` from this file (``reward.custom_reward_function.path/name``) and calls it as
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)``; the recipe's
``task.reward`` arrives as the ``tunekit_reward`` keyword (``reward.custom_reward_function.reward_kwargs``), and
the prompt from the row's ``extra_info["prompt"]`` (:mod:`tunekit.runners.verl_data`). The user's function is
called with tunekit's reward signature, either spelling (:mod:`tunekit.workload.reward`).
"""

from __future__ import annotations

import functools
from typing import Any

from tunekit.config import TaskConfig
from tunekit.workload.base import RewardFn
from tunekit.workload.reward import as_reward_fn, import_reward

REWARD_KWARG = "tunekit_reward"
DEFAULT_REWARD: str = TaskConfig.model_fields["reward"].default


@functools.cache
def _reward(spec: str, source: str) -> RewardFn:
    return as_reward_fn(import_reward(spec), source)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None,
                  tunekit_reward: str = DEFAULT_REWARD, **_: Any) -> float:
    """The reward of one response, as a float (verl adds it to the sequence's last token)."""
    prompt = str((extra_info or {}).get("prompt", ""))
    return _reward(tunekit_reward, str(data_source))(prompt, solution_str, str(ground_truth))
