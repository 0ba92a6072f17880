"""The user's reward function, ``task.reward = "module:function"``, imported from the Python path.

The contract is verl's custom reward function: the prompt, the response and the row's answer in, a float out.
Both spellings are accepted, so a function written for verl works unchanged:

- ``function(prompt, response, answer) -> float``
- ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | {"score": float, ...}``
  (``data_source`` is the dataset file's name, ``extra_info`` holds ``{"prompt": ...}``).
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tunekit.errors import ConfigError
from tunekit.workload.base import RewardFn


def import_reward(spec: str) -> Callable:
    """The callable ``spec`` names; the working directory is searched first, as ``python -m`` would."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"task.reward {spec!r} is not module:function; write it like my_rewards:score.")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - the user's module may fail however it likes while importing
        raise ConfigError(f"task.reward {spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {e}); "
                          "put its directory on PYTHONPATH or run tunekit from it.") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"task.reward {spec!r}: {module_name} has no function {attr!r}; name a function defined in it.")
    return fn


def as_reward_fn(fn: Callable, data_source: str) -> RewardFn:
    """``fn`` called the way its signature asks (see the module docstring), returning a float."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "solution_str" in params:
        def call(prompt: str, response: str, answer: str):
            return fn(data_source=data_source, solution_str=response, ground_truth=answer, extra_info={"prompt": prompt})
    else:
        def call(prompt: str, response: str, answer: str):
            return fn(prompt, response, answer)

    def reward(prompt: str, response: str, answer: str) -> float:
        return to_float(call(prompt, response, answer))

    return reward


def to_float(value) -> float:
    """A reward as a float: a real number, or verl's ``{"score": x, ...}``; anything else raises TypeError."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", None) == 0):
        out = float(value)
        if not math.isnan(out):
            return out
        raise TypeError("the reward is NaN")
    raise TypeError(f"the reward is {type(value).__name__} {value!r:.60}, not a number")


def load_reward(spec: str, dataset: str | None) -> RewardFn:
    """``task.reward`` as a :data:`~tunekit.workload.base.RewardFn`."""
    return as_reward_fn(import_reward(spec), Path(dataset).stem if dataset else "arithmetic")
