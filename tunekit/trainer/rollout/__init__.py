"""Rollout backends. A name → class map lives in one place: :func:`make_rollout`."""

from __future__ import annotations

from typing import Any


def make_rollout(backend: str, **kwargs: Any):
    """Build the rollout engine for ``backend``; vLLM modules are imported only when asked for."""
    if backend == "hf":
        from tunekit.trainer.rollout.hf import HFRollout

        return HFRollout(**kwargs)
    if backend == "vllm":
        from tunekit.trainer.rollout.vllm_engine import VLLMRollout

        return VLLMRollout(**kwargs)
    if backend == "vllm_server":
        from tunekit.trainer.rollout.vllm_server import VLLMServerRollout

        return VLLMServerRollout(**kwargs)
    raise ValueError(f"unknown rollout backend {backend!r}")
