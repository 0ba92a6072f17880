"""Fault injection for testing probe isolation: a crash, an OOM or a hang in the last rank."""

from __future__ import annotations

import os
import signal
import time

import torch

FAULT_STEP = 1


def maybe_inject(fault: str, *, step: int, rank: int, world: int) -> None:
    """At step ``FAULT_STEP`` the last rank fails the way ``fault`` says; other ranks carry on."""
    if fault == "none" or step != FAULT_STEP or rank != world - 1:
        return
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word, like a segfault or the OOM killer
    if fault == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (injected by probe.fault=oom)")
    if fault == "hang":
        while True:  # like a rank stuck in a collective that never completes
            time.sleep(3600)
