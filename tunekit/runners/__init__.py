"""Runners: each turns a resolved recipe into a probe's process tree (see :class:`Runner`).

``builtin`` is tunekit's own trainer, ``trl`` TRL's GRPOTrainer, ``verl`` verl's PPO trainer. A runner is one module here with a :class:`Runner`
subclass: :meth:`~Runner.check` refuses the knobs it cannot express, :meth:`~Runner.command`
and :meth:`~Runner.env` start the probe, :meth:`~Runner.handback` writes a search's winner
in the runner's own words. Adding one: its class in :data:`RUNNERS` and its name in
``tunekit.config.RunnerName`` (the recipe's ``runner`` key).
"""

from __future__ import annotations

from tunekit.config import Recipe
from tunekit.runners.base import Handback, Runner, probe_env
from tunekit.runners.builtin import BuiltinRunner
from tunekit.runners.trl import TrlRunner
from tunekit.runners.verl import VerlRunner

RUNNERS: dict[str, type[Runner]] = {"builtin": BuiltinRunner, "trl": TrlRunner, "verl": VerlRunner}


def runner_for(recipe: Recipe) -> Runner:
    """The runner the recipe's ``runner`` key names. The callers above the estimate hand it this function
    (:data:`tunekit.estimate.traits.Rules`), as the estimate sits below the runners."""
    return RUNNERS[recipe.runner]()


__all__ = ["RUNNERS", "Handback", "Runner", "probe_env", "runner_for"]
