"""Rollout engines, one module each; :data:`ENGINES` maps ``system.rollout.backend`` to the engine class (what
each backend is and where it runs: :mod:`tunekit.placement.backends`). Each engine class checks before a probe
what this machine or recipe lacks for it (its ``preflight``). Only the vLLM modules import vllm, and only when an
engine is built."""

from __future__ import annotations

from tunekit.config import RolloutConfig
from tunekit.trainer.rollout import hf, vllm_engine, vllm_server

ENGINES: dict[str, type] = {"hf": hf.HFRollout, "vllm": vllm_engine.VLLMRollout,
                            "vllm_server": vllm_server.VLLMServerRollout}


def engine_of(rc: RolloutConfig) -> type:
    return ENGINES[rc.backend]
