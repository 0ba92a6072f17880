"""Whether a probe runs on a GPU, and which physical GPU a device-map index names.

The launcher asks :func:`on_gpu` before it starts anything, the ranks when they pick their device.

Device-map indices count the GPUs the launcher was given, as torch does: under
``CUDA_VISIBLE_DEVICES=2,3`` index 0 is GPU 2. The launcher records its view in
``TUNEKIT_LAUNCH_GPUS`` for every process of the probe, because the trainer's own
``CUDA_VISIBLE_DEVICES`` is narrowed to its ranks' GPUs while a vLLM server and the
NVML sampler still need the others' physical ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch

LAUNCH_GPUS_ENV = "TUNEKIT_LAUNCH_GPUS"


def launch_gpus(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The launcher's visible GPU ids, or None when it saw every GPU of the machine."""
    env = os.environ if env is None else env
    visible = env.get(LAUNCH_GPUS_ENV, env.get("CUDA_VISIBLE_DEVICES"))
    if visible is None or not visible.strip():
        return None
    return [v.strip() for v in visible.split(",") if v.strip()]


def physical_ids(indices: Iterable[int], env: Mapping[str, str] | None = None) -> list[str]:
    """The ids (as ``CUDA_VISIBLE_DEVICES`` writes them) of the GPUs that device-map ``indices`` name."""
    seen = launch_gpus(env)
    return [str(i) if seen is None else seen[i] for i in indices]


def nvml_indices(indices: Iterable[int], env: Mapping[str, str] | None = None) -> list[int]:
    """NVML indices of device-map ``indices`` (an id that is a UUID keeps the device-map index)."""
    indices = list(indices)
    return [int(p) if p.isdigit() else i for i, p in zip(indices, physical_ids(indices, env))]


def visible_devices(indices: Iterable[int], env: Mapping[str, str] | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that exposes exactly ``indices``."""
    return ",".join(physical_ids(indices, env))


def on_gpu(device: str, cuda_count: int | None = None) -> bool:
    """Whether ``system.device`` (``cuda`` / ``cpu`` / ``auto``) runs on CUDA: ``auto`` is CUDA when this machine
    has a GPU (``cuda_count``, default: the GPUs torch sees)."""
    if device == "auto":
        return (torch.cuda.device_count() if cuda_count is None else cuda_count) > 0
    return device == "cuda"
