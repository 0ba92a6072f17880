"""The interpreter's garbage-collection pauses, as ``gc.callbacks`` report them.

A host-bound phase (an eager decode, a small model's update) stalls while Python collects; a full collection
walks every tracked object, so its cost grows with what the process keeps (torch.compile's graphs above all,
see :mod:`tunekit.trainer.heap`). The phase timer charges each pause to the step and to the phases open
while it ran, which tells a GC stall from a slow kernel.
"""

from __future__ import annotations

import gc
import time


class GcPauses:
    """Seconds spent in collections, and how many were full (generation 2), while :meth:`start`-ed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began: float | None = None

    def start(self) -> None:
        self.seconds, self.full, self._began = 0.0, 0, None
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.full += info.get("generation") == 2
            self._began = None
