"""The search's time limit (``tunekit search --time-limit``): no probe starts that is expected to end after it.

A probe is expected to take as long as the longest probe the study has finished, trials and confirmation probes
alike (the one that paid a cold compile is the longest), else its timeout, the bound it runs under. A search
stopped at its limit writes search.json saying so, with the command that continues it: ``--resume`` reads the
study back and repeats no finished probe, the confirmation round's included.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

from tunekit.search.budget import KILL_GRACE_S

STOP = "time limit"
"""How a stop reason at the time limit begins."""
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM); the running probe is retried on --resume"
"""The stop reason of a search interrupted by a signal."""


def stopped(reason: str) -> bool:
    """Whether a search's stop reason is its time limit."""
    return reason.startswith(STOP)


def resumable(reason: str) -> bool:
    """Whether a search stopped before its end (time limit or a signal), so ``--resume`` continues it."""
    return stopped(reason) or reason == INTERRUPTED


def expected_probe_s(trials: Iterable[optuna.trial.FrozenTrial], probes: Iterable[Mapping[str, Any]],
                     timeout_s: float) -> float:
    """The wall time the next probe is expected to take: the longest of the study's finished probes (``trials``'
    ``wall_s`` and the confirmation round's ``probes``), else ``timeout_s`` and the kill grace."""
    walls = [float(t.user_attrs["wall_s"]) for t in trials if t.user_attrs.get("wall_s") is not None]
    walls += [float(p["wall_s"]) for p in probes if p.get("wall_s") is not None]
    return max(walls) if walls else timeout_s + KILL_GRACE_S


@dataclass
class Deadline:
    """``limit_s`` seconds from the search's start (None: no limit)."""

    limit_s: float | None
    start: float = field(default_factory=time.monotonic)

    def why_not(self, expected_s: float) -> str | None:
        """Why a probe expected to take ``expected_s`` may not start (a stop reason), None when it may."""
        if self.limit_s is None:
            return None
        used = time.monotonic() - self.start
        if used + expected_s <= self.limit_s:
            return None
        return (f"{STOP}: {used:.0f} s of --time-limit {self.limit_s:g} s used and the next probe is expected to take "
                f"{expected_s:.0f} s; run the same command with --resume to continue (no finished probe is repeated)")
