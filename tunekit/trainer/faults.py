"""Fault injection for tests of probe isolation and of searches: a crash, an abort, an OOM or a hang in the last rank.

Not a recipe key: a test sets ``TUNEKIT_FAULT`` in the environment a probe inherits. Its value is a fault
kind (``crash``, ``abort``, ``oom``, ``hang``), optionally followed by ``@KEY=VALUE`` so only probes whose resolved recipe
has that value at the dotted key fail, e.g. ``oom@system.batch.micro_batch_size=2``: a search test makes
exactly the trials that sample that value fail.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from tunekit.config import Recipe, apply_overrides

FAULT_ENV = "TUNEKIT_FAULT"
FAULT_STEP = 1
KINDS = ("crash", "abort", "oom", "hang")


def fault_for(recipe: Recipe) -> str:
    """The fault ``TUNEKIT_FAULT`` asks of a probe of ``recipe``: one of :data:`KINDS`, or ``none``."""
    rule = os.environ.get(FAULT_ENV, "").strip()
    if not rule:
        return "none"
    kind, _, when = rule.partition("@")
    if kind not in KINDS:
        raise ValueError(f"{FAULT_ENV}={rule!r}: the fault must be one of {', '.join(KINDS)}, e.g. oom@system.batch.micro_batch_size=2.")
    if not when:
        return kind
    raw = recipe.model_dump(mode="json")
    # the rule holds when setting KEY=VALUE leaves the recipe as it is (config's own parsing of KEY=VALUE)
    return kind if apply_overrides(raw, [when], source=FAULT_ENV) == apply_overrides(raw, []) else "none"


def maybe_inject(fault: str, *, step: int, rank: int, world: int) -> None:
    """At step ``FAULT_STEP`` the last rank fails the way ``fault`` says; other ranks carry on."""
    if fault == "none" or step != FAULT_STEP or rank != world - 1:
        return
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word, like a segfault or the OOM killer
    if fault == "abort":  # like a C++ library's uncaught exception: its last words on stderr, then SIGABRT
        sys.stderr.write(f"terminate called after throwing an instance of 'std::runtime_error'\n"
                         f"  what():  connection closed by peer (injected by {FAULT_ENV})\n")
        sys.stderr.flush()
        os.abort()
    if fault == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {FAULT_ENV})")
    if fault == "hang":
        while True:  # like a rank stuck in a collective that never completes
            time.sleep(3600)
