"""Which machine a probe ran on: its host and GPUs, as one short digest.

A search's probes may run on several machines (a study resumed on another one, workers on several hosts), and two
machines of the same GPU kind can step the same configuration at different speeds. A probe's summary carries the
digest (:data:`tunekit.metrics.MACHINE`) so that a cold start measured on one machine prices only the warm probes of that machine
(:mod:`tunekit.estimate.cold_start`) and an answer says when the probes it compares ran on different machines.
"""

from __future__ import annotations

import hashlib
import socket

from tunekit.profiler.nvml import gpu_uuids


def machine_id() -> str:
    """A 12-character digest of this host's name and its GPUs' NVML UUIDs (the host's name alone without NVML)."""
    try:
        uuids = sorted(gpu_uuids())
    except Exception:  # noqa: BLE001 - a driver that cannot name its GPUs leaves the host's name to tell machines apart
        uuids = []
    parts = [socket.gethostname(), *uuids]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]
