"""The user's ``task.reward`` as verl's custom reward function.

verl loads ``compute_score`` from this file (``reward.custom_reward_function.path/name``) and calls it as
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)``; the recipe's
``task.reward`` arrives as the ``tunekit_reward`` keyword (``reward.custom_reward_function.reward_kwargs``). The
rows :mod:`tunekit.runners.verl_data` writes carry the prompt text in ``extra_info[PROMPT_KEY]``, taken out again
here with the keys verl adds (:data:`VERL_ADDED`), so the user's function sees the row's own ``extra_info`` and is
called exactly as under tunekit's loop
(:class:`tunekit.workload.UserReward`): a reward that raises or gives no finite number stops verl with the same
sentence.
"""

from __future__ import annotations

import functools
from typing import Any

from tunekit.config import TaskConfig
from tunekit.workload.base import Prompt
from tunekit.workload.reward import UserReward, load_reward

REWARD_KWARG = "tunekit_reward"
DEFAULT_REWARD: str = TaskConfig.model_fields["reward"].default
PROMPT_KEY = "tunekit_prompt"
"""The ``extra_info`` key the written rows keep the prompt text under."""
VERL_ADDED = ("num_turns", "rollout_reward_scores")
"""Keys verl 0.9's reward loop adds to every row's ``extra_info`` (``reward_manager/naive.py``), taken out again
here: the user's function sees what the row gave, as under the other runners."""


@functools.cache
def _reward(spec: str) -> UserReward:
    return load_reward(spec, "verl's train file")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None,
                  tunekit_reward: str = DEFAULT_REWARD, **_: Any) -> float | dict[str, float]:
    """The reward of one response (verl adds it to the sequence's last token): a float, or with the numbers the
    user's dict gave beside its score, ``{"score": x, ...}`` (verl logs those keys)."""
    info = {k: v for k, v in (extra_info or {}).items() if k not in VERL_ADDED}
    text = str(info.pop(PROMPT_KEY, ""))
    index = info.get("index")
    prompt = Prompt(text, str(ground_truth), data_source=str(data_source), extra_info=info,
                    row=index if isinstance(index, int) else None)
    score = _reward(tunekit_reward)(prompt, str(solution_str))
    return {"score": score.value, **score.extra} if score.extra else score.value
