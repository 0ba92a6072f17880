"""The user's reward function, ``task.reward = "module:function"``, imported from the Python path.

The contract is verl's custom reward function, so a function written for verl works unchanged under every runner.
Either spelling is accepted, always with strings for the texts:

- ``function(prompt, response, answer) -> float``
- ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | {"score": float, ...}``:
  called with keywords, as verl calls it (keyword-only parameters work; a parameter it lacks is not passed), with
  the row's ``data_source`` and ``extra_info`` (:class:`~tunekit.workload.base.Prompt`).

A dict's keys beside ``score`` that hold numbers come back as :attr:`Score.extra`. A call that raises or gives no
finite number is a :class:`RewardError`: one sentence naming ``task.reward``, the row, the response and what came
back.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
import site
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunekit.config.errors import ConfigError, TunekitError
from tunekit.workload.base import Prompt

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
TUNEKIT_ARGS = ("prompt", "response", "answer")


class RewardError(TunekitError):
    """The user's reward failed on one response (raised, or gave no finite number in range)."""


@dataclass(frozen=True)
class Score:
    """One response's reward, and the numbers a dict return gave beside ``score``."""

    value: float
    extra: dict[str, float] = field(default_factory=dict)


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
        missing = isinstance(e, ModuleNotFoundError) and (module_name == e.name or module_name.startswith(f"{e.name}."))
        hint = ("put its directory on PYTHONPATH or run tunekit from it" if missing else
                "it was found, and failed while importing: fix it (or install what it imports)")
        raise ConfigError(f"task.reward {spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {e}); "
                          f"{hint}.") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        what = f"has {attr!r}, a {type(fn).__name__}, not a function" if hasattr(module, attr) else f"has no function {attr!r}"
        raise ConfigError(f"task.reward {spec!r}: {module_name} {what}; name a function defined in it.")
    return fn


def import_root(spec: str) -> Path | None:
    """The directory ``spec``'s module imports from (its top package's parent), for a command run elsewhere to put
    on ``PYTHONPATH``; None for tunekit's own rewards and modules installed in site-packages."""
    import_reward(spec)
    module_name = spec.partition(":")[0]
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None or module_name.split(".")[0] == "tunekit":
        return None
    root = Path(file).resolve().parent
    for _ in range(module_name.count(".") + (Path(file).name == "__init__.py")):
        root = root.parent
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return None if root in installed else root


def takes_verl_args(fn: Callable) -> bool:
    """Whether ``fn`` is written in verl's spelling (names ``solution_str`` or ``ground_truth``)."""
    return bool(set(_parameters(fn)) & {"solution_str", "ground_truth"})


def _parameters(fn: Callable) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def caller(fn: Callable) -> Callable[[Prompt, str], Any]:
    """``fn`` called on one prompt and response the way its signature asks (see the module docstring)."""
    params = _parameters(fn)
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if takes_verl_args(fn):
        names = [n for n in VERL_ARGS if any_keyword or n in params]

        def call(p: Prompt, response: str):
            values = {"data_source": p.data_source, "solution_str": response, "ground_truth": p.answer,
                      "extra_info": dict(p.extra_info)}
            return fn(**{n: values[n] for n in names})
    elif set(TUNEKIT_ARGS) <= set(params):
        def call(p: Prompt, response: str):
            return fn(prompt=p.text, response=response, answer=p.answer)
    else:
        def call(p: Prompt, response: str):
            return fn(p.text, response, p.answer)
    return call


class UserReward:
    """``task.reward`` scoring one response: a :class:`Score`, or a :class:`RewardError` naming what went wrong.
    ``source`` names where the prompts come from in that sentence."""

    def __init__(self, fn: Callable, spec: str, source: str) -> None:
        self.spec, self.source, self._call = spec, source, caller(fn)

    def __call__(self, prompt: Prompt, response: str) -> Score:
        try:
            out = self._call(prompt, str(response))
        except Exception as e:  # noqa: BLE001 - whatever the user's function raises is reported
            raise RewardError(self.sentence(prompt, response, f"raised {type(e).__name__}: {str(e)[:160]}")) from None
        score = to_score(out)
        if score is None:
            raise RewardError(self.sentence(prompt, response, f"returned {_shown(out)}, {_not_what(out)}"))
        return score

    def sentence(self, prompt: Prompt, response: str, what: str, todo: str = "") -> str:
        """One sentence: the reward, the row, the response tried, what came back and what to do."""
        todo = todo or "fix the function so it returns a finite number (or a dict with a finite 'score') for any response"
        return (f"task.reward {self.spec!r} {what} on {prompt.where()} of {self.source} with the response "
                f"{_response(response)}; {todo}.")


def extra_sums(scores: list[Score]) -> dict[str, tuple[float, int]]:
    """Per key the responses' dicts gave beside their score: its sum and how many responses gave it (the parts a
    step's mean is made of, added up across ranks before dividing)."""
    out: dict[str, tuple[float, int]] = {}
    for score in scores:
        for key, value in score.extra.items():
            total, n = out.get(key, (0.0, 0))
            out[key] = (total + value, n + 1)
    return out


def merge_extra(parts: list[dict[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    """Several :func:`extra_sums` (one per rank or worker) added up per key."""
    out: dict[str, tuple[float, int]] = {}
    for part in parts:
        for key, (total, n) in part.items():
            t0, n0 = out.get(key, (0.0, 0))
            out[key] = (t0 + total, n0 + n)
    return out


def extra_means(parts: list[dict[str, tuple[float, int]]]) -> dict[str, float]:
    """``reward/extra/<key>`` metrics: each key's mean over every response (of every part) that gave it."""
    from tunekit.metrics import reward_extra

    # a metric name's parts are split at "/": a key's own slashes become "_"
    return {reward_extra(key.replace("/", "_")): total / n for key, (total, n) in sorted(merge_extra(parts).items()) if n}


def to_score(value: Any) -> Score | None:
    """A reward as a :class:`Score`: a finite real number, or verl's ``{"score": x, ...}`` (its other numeric keys
    as ``extra``); None for anything else."""
    extra: dict[str, float] = {}
    if isinstance(value, dict):
        extra = {str(k): float(v) for k, v in value.items() if k != "score" and _real(v) is not None}
        value = value.get("score")
    number = _real(value)
    return Score(number, extra) if number is not None else None


def _real(value: Any) -> float | None:
    if isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", None) == 0):
        try:
            out = float(value)
        except (TypeError, ValueError):
            return None
        return out if math.isfinite(out) else None
    return None


def _not_what(value: Any) -> str:
    inner = value.get("score") if isinstance(value, dict) else value
    is_number = isinstance(inner, numbers.Real) or hasattr(inner, "item")
    return "not a finite number" if is_number else "not a number"


def _shown(value: Any) -> str:
    if isinstance(value, dict) and "score" in value:
        return f"a dict whose 'score' is {value['score']!r:.40}"
    if isinstance(value, dict):
        return f"a dict without a 'score' key (keys: {', '.join(map(str, list(value)[:5]))})"
    if isinstance(value, float) or value is None:
        return repr(value)
    return f"{type(value).__name__} {value!r:.40}"


def _response(text: str) -> str:
    if len(text) <= 60:
        return repr(text)
    return f"{text[:40]!r}... ({len(text)} characters)"


def load_reward(spec: str, source: str) -> UserReward:
    """``task.reward`` as a :class:`UserReward`."""
    return UserReward(import_reward(spec), spec, source)
