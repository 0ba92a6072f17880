"""What a runner's framework does that an estimate counts: each runner declares its own traits
(:attr:`tunekit.runners.base.Runner.traits`) and resolves its own training path, and the callers above the estimate
hand the runners in (:data:`Rules`), as the estimate sits below the runners."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tunekit.config import Recipe


@dataclass(frozen=True)
class RunnerTraits:
    """Each of a runner's rules that the memory estimate or the compile cache's key depends on."""

    bf16_beside_masters: bool
    """A trained role that is the plain module on a GPU computes with bf16 weights beside its fp32 masters where
    ``system.memory.master_weights`` keeps them (:meth:`~tunekit.config.system.MemoryConfig.keeps_masters`)."""
    plain_ref_bf16: bool
    """A reference that is the plain module holds its frozen weights in bf16."""
    training_graphs: bool
    """Compiled training passes replay as CUDA graphs where ``system.cuda_graphs`` says so
    (:meth:`~tunekit.config.system.SystemConfig.captures`)."""
    engine_graphs_outside: bool
    """Its in-process vLLM engine's captured CUDA graphs (``enforce_eager: false``) hold memory outside the allocator
    (:data:`tunekit.estimate.memory.ENGINE_GRAPHS_GIB`)."""
    wakes_beside_cache: bool
    """A sleeping engine wakes beside training's cached blocks, handed back first only where the engine's pool would
    not fit beside them (:func:`tunekit.trainer.rollout.vllm_engine.must_empty_cache`)."""
    graphs_any_batch: bool
    """Its compiled graphs take any batch size (:func:`tunekit.trainer.parallel.dynamic_shapes`), so the micro-batch is
    no part of their key (:func:`tunekit.estimate.cold_start.graphs_key`)."""


class RunnerRules(Protocol):
    """What the estimate asks of a recipe's runner (:class:`tunekit.runners.base.Runner` is one)."""

    @property
    def traits(self) -> RunnerTraits:
        """What its framework does that the memory estimate and the compile cache's key count."""

    def training_path(self, recipe: Recipe, *, gpu: bool) -> dict[str, bool]:
        """What it resolves the training path to on a GPU or not (``resolved/compile``, ``resolved/cuda_graphs``,
        ...: :meth:`tunekit.runners.base.Runner.training_path`)."""


Rules = Callable[[Recipe], RunnerRules]
"""A recipe's runner (``tunekit.runners.runner_for``), handed to the cost model by its callers."""
