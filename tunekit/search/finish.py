"""How the workers of one study end with one answer.

A worker whose trials ran out waits while other workers' trials still run (each within the probe's timeout and the
heartbeat grace, after which its worker is taken for dead). Then exactly one worker runs the confirmation round:
the first to claim it under the study lock (:mod:`tunekit.search.lock`); the claim, a study user attr, names the
worker and how many trials the study had, so a resumed search with new trials confirms again. The others wait for
the claim to say the round is done. Every worker then builds its answer from the study alone, so all print and
write the same one; the confirming worker also keeps it in the study (``RESULT_ATTR``) for ``tunekit report
--storage``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import optuna
from optuna.trial import TrialState

from tunekit.search import storage as studies
from tunekit.search.budget import KILL_GRACE_S
from tunekit.search.lock import StudyLock

CLAIM_ATTR = "confirmation_claim"
"""Study user attr: ``{"worker", "trials", "round", "done"}`` of the worker that runs (or ran) the confirmation round,
``round`` its ``[confirm_top, confirm_seeds, confirm_references]``."""
RESULT_ATTR = "search_result"
"""Study user attr: the final search.json, as the confirming worker wrote it."""
POLL_S = 2.0
"""How often a waiting worker reads the study again."""


def _running(study: optuna.Study, timeout_s: float) -> list[optuna.trial.FrozenTrial]:
    """Other workers' trials still running within their time: the probe's timeout, the kill grace and the heartbeat
    grace after their start."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    limit = timeout_s + KILL_GRACE_S + studies.GRACE_S
    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING and t.datetime_start is not None
            and (now - t.datetime_start.replace(tzinfo=None)).total_seconds() < limit and not studies.dead_local_worker(t)]


def wait_for_others(study: optuna.Study, timeout_s: float, progress: Callable[[dict[str, Any]], None],
                    poll_s: float = POLL_S) -> None:
    """Until no other worker's trial runs (each given its probe's timeout), reading the study every ``poll_s``."""
    said = None
    while running := _running(study, timeout_s):
        numbers = [t.number for t in running]
        if numbers != said:
            progress({"event": "wait", "trials": numbers})
            said = numbers
        time.sleep(poll_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a worker on another host that died


def claim(study: optuna.Study, storage: optuna.storages.BaseStorage, round_: tuple[int, int, bool]) -> bool:
    """True when this worker is to run the confirmation round of ``round_`` (``confirm_top``, ``confirm_seeds``,
    ``confirm_references``): no worker has claimed it for the study's current trials and that round (a search resumed
    with more seeds or candidates, or with the references brought in, runs the round on, its finished probes kept), or
    the one that did died before it was done. Read and written under the study lock."""
    lock = StudyLock(storage, study.study_name)
    lock.acquire()
    try:
        n = len(study.get_trials(deepcopy=False))
        held = study.user_attrs.get(CLAIM_ATTR) or {}
        same = held.get("trials") == n and held.get("round", list(round_)) == list(round_)  # a claim from before rounds were named: this one
        if same and (held.get("done") or not _dead(held)):
            return False
        study.set_user_attr(CLAIM_ATTR, {"worker": studies.worker_id(), "trials": n, "round": list(round_), "done": False})
        return True
    finally:
        lock.release()


def _dead(held: dict[str, Any]) -> bool:
    """The claiming worker ran on this host and its process is gone (another host's is trusted to finish)."""
    return studies.dead_local(str(held.get("worker", "")))


def done(study: optuna.Study, result: dict[str, Any]) -> None:
    """The round is over: the claim says so, and the study keeps the final search.json."""
    study.set_user_attr(RESULT_ATTR, result)
    study.set_user_attr(CLAIM_ATTR, {**(study.user_attrs.get(CLAIM_ATTR) or {}), "done": True})


def release(study: optuna.Study) -> None:
    """The claiming worker stopped its round before the end (time limit, signal): the next worker, or the resumed
    search on any host, claims it and continues it."""
    study.set_user_attr(CLAIM_ATTR, None)


def wait_for_round(study: optuna.Study, limit_s: float, progress: Callable[[dict[str, Any]], None],
                   poll_s: float = POLL_S) -> str | None:
    """Until the claiming worker says its round is done (None), or ``limit_s`` passes or it died (why, in words)."""
    held = study.user_attrs.get(CLAIM_ATTR) or {}
    if not held.get("done"):  # a round over (a finished search resumed) is read back, not waited for
        progress({"event": "wait_round", "worker": held.get("worker")})
    end = time.monotonic() + limit_s
    while not held.get("done"):
        if _dead(held):
            return f"the worker running the confirmation round ({held.get('worker')}) stopped before it was done"
        if time.monotonic() > end:
            return f"the confirmation round in {held.get('worker')} did not end within {limit_s:.0f} s"
        time.sleep(poll_s)
        held = study.user_attrs.get(CLAIM_ATTR) or {}
    return None
