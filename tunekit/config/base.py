"""What every recipe section shares: the roles, the prompt budget, what a key changes (``Effect``), the strict base
model."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from tunekit.datadirs import data_dir

RECIPES_DIR = data_dir("recipes")
ROLES = ("actor", "critic", "ref", "rollout", "reward")
PROMPT_TOKEN_BUDGET = 512
"""Tokens a prompt may take in a vLLM engine's context: its context length is this plus ``task.max_new_tokens``
(within the model's positions)."""
RunnerName = Literal["builtin", "trl", "verl"]
"""The runners a recipe may name: the keys of ``tunekit.runners.RUNNERS``."""


Effect = Literal["learning", "systems", "probe"]
"""What a key changes: ``learning`` (what the model learns: the reward curve), ``systems`` (only memory,
speed and cost: a probe must learn alike under any value), ``probe`` (only the measurement or the search,
not a training step). A section declares it for its fields (``effect``); a field that differs says so with
``Field(json_schema_extra=LEARNING)`` (or ``SYSTEMS``)."""
LEARNING: dict[str, Any] = {"effect": "learning"}
SYSTEMS: dict[str, Any] = {"effect": "systems"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    effect: ClassVar[Effect]

