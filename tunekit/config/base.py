"""What every recipe section shares: the roles, the prompt budget, what a key changes (``Effect``), the strict base
model."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

from tunekit.config.datadirs import data_dir

RECIPES_DIR = data_dir("recipes")
ROLES = ("actor", "critic", "ref", "rollout", "reward")
SHIPPED_PREFIX = "tunekit:"
"""What starts the name of a dataset tunekit ships (``task.dataset: tunekit:<name>``; :mod:`tunekit.workload.shipped`)."""
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


def http_url(v: str | None) -> str | None:
    """A server's base URL as a recipe gives it: http(s), no trailing slash, and no trailing ``/v1`` (the OpenAI
    client's base URL, where tunekit adds the ``/v1/...`` paths itself); None stays None."""
    if v is not None and not v.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
    return v.rstrip("/").removesuffix("/v1") if v else v


ServerUrl = Annotated[str | None, AfterValidator(http_url)]
"""A recipe key holding a server's base URL (checked by :func:`http_url`)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    effect: ClassVar[Effect]

