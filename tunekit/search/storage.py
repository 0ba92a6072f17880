"""Where a search's Optuna study lives, and how a killed search is recovered.

Storage is an ``RDBStorage`` (SQLite file by default, PostgreSQL for several
workers) with Optuna's heartbeat on, so a trial whose worker died turns FAIL and
is retried. A worker on this host that was killed (``kill -9``) is recognised at
once by its pid, without waiting for the heartbeat grace period; its orphaned
probe process tree is ended and its run dir marked abandoned.

FAIL is reserved for "the search process itself stopped during this trial";
every probe outcome (ok, oom, timeout, crash) is a COMPLETE or PRUNED trial.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.trial import TrialState

from tunekit.estimate import cost
from tunekit.estimate.cost import Priced
from tunekit.config.errors import ConfigError
from tunekit.rundir import ABANDONED, RUN_DIR_ENV, read_summary, span_s, study_db, write_summary

HEARTBEAT_S = 15
"""Seconds between heartbeats of a running trial."""
GRACE_S = 60
"""A RUNNING trial without a heartbeat for this long belongs to a dead worker (any host)."""
MAX_RETRIES = 2


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{study_db(Path(out_dir).resolve())}"


def _sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///"))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def driver_url(url: str) -> str:
    """SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3; use psycopg2 (the ``postgres`` extra) when only it is installed."""
    if url.startswith(("postgresql://", "postgres://")) and importlib.util.find_spec("psycopg") is None:
        if importlib.util.find_spec("psycopg2") is None:
            raise ConfigError(f"--storage {redact(url)} needs a PostgreSQL driver; run `pip install -e \".[postgres]\"`.")
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def check_url(url: str, *, must_exist: bool = False) -> None:
    """ConfigError, touching nothing, for a storage URL no search can use: an in-memory database, or a SQLite file
    whose folder is missing (or, ``must_exist``, that is not there)."""
    if url.startswith("sqlite") and (url.rstrip("/") in ("sqlite:", "sqlite:/", "sqlite://") or ":memory:" in url):
        raise ConfigError(f"--storage {url}: an in-memory database lives in one connection, and a search's heartbeat "
                          "and workers open their own; give a file, e.g. sqlite:///study.db.")
    path = _sqlite_path(url)
    if path is not None:
        if must_exist and not path.exists():
            raise ConfigError(f"--resume: no study database at {path}; run the search once without --resume first.")
        if not path.parent.is_dir():
            what = "is a file, not a directory" if path.parent.exists() else "does not exist"
            raise ConfigError(f"--storage {url}: {path.parent} {what}; create the directory or pick another path.")


def open_storage(url: str, *, must_exist: bool) -> optuna.storages.RDBStorage:
    """Connect (creating Optuna's tables if needed); ConfigError when the URL can't be reached (:func:`check_url`)."""
    check_url(url, must_exist=must_exist)
    try:
        return _rdb(url)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - sqlalchemy/driver errors vary by backend
        if not _tables_made_meanwhile(e):
            raise _unreachable(url, e) from None
    time.sleep(1.0)  # two searches made one new database's tables at once: open them as the other left them
    try:
        return _rdb(url)
    except Exception as e:  # noqa: BLE001
        raise _unreachable(url, e) from None


def _rdb(url: str) -> optuna.storages.RDBStorage:
    connect = {"timeout": 60} if _sqlite_path(url) is not None else {"connect_timeout": 5} if url.startswith("postgres") else {}
    return optuna.storages.RDBStorage(
        driver_url(url), engine_kwargs={"connect_args": connect, "pool_pre_ping": True},
        heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, heartbeat_stale_trial_callback=retry_trial,
    )


def _tables_made_meanwhile(e: BaseException) -> bool:
    """Whether Optuna's table creation lost a race with another process's: a table it went to make exists by now, or
    its schema version row (which is unique) does."""
    text = str(e)
    return "already exists" in text or ("alembic_version" in text and any(
        w in text for w in ("UNIQUE", "unique", "duplicate key")))


def _unreachable(url: str, e: BaseException) -> ConfigError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ConfigError(f"--storage {redact(url)} cannot be reached ({first[:160]}); check the URL and that the server is up.")


def redact(url: str) -> str:
    """Hide a password in a database URL."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':')[0]}:***@{host}"
    return url


def study_exists(storage: optuna.storages.RDBStorage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------- recovery


def retry_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Re-enqueue a FAIL trial's params (at most MAX_RETRIES times); Optuna's heartbeat callback too."""
    history = list(trial.system_attrs.get("retry_history", [])) + [trial.number]
    if len(history) > MAX_RETRIES or trial.number in _retried(study):
        return False
    keep = {k: v for k, v in trial.user_attrs.items() if k in ("baseline", "reference", "reference_sets")}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
        user_attrs=keep | {"retry_of": trial.number}, system_attrs={"failed_trial": history[0], "retry_history": history},
    ))
    return True


def _retried(study: optuna.Study) -> set[int]:
    """Numbers of trials that already have a retry (a finished trial's attrs can't be changed)."""
    return {n for t in study.get_trials(deepcopy=False) for n in t.system_attrs.get("retry_history", [])}


def dead_local(worker: str) -> bool:
    """Worker ``host:pid`` (:func:`worker_id`) ran on this host and its process is gone."""
    host, _, pid = str(worker).rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid))


def dead_local_worker(trial: optuna.trial.FrozenTrial) -> bool:
    return dead_local(str(trial.user_attrs.get("worker", "")))


def _end_orphan_probe(run_dir: str) -> None:
    """Kill what is left of a probe whose search was killed (it runs in its own session).

    Every process of a probe carries ``TUNEKIT_RUN_DIR=<run dir>`` in its environment
    (Ray and vLLM children too); the rank entry points also name the run dir on their command line.
    """
    tag = str(Path(run_dir).resolve())
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_DIR_ENV) == tag or run_dir in proc.cmdline():
                proc.kill()
        except psutil.Error:  # gone, or not ours to read or end
            continue




def mark_abandoned(run_dir: str, why: str) -> None:
    """A probe the search stopped part-way: its run dir's summary says ``abandoned: why`` (it is probed again)."""
    summary = read_summary(Path(run_dir)) if Path(run_dir).is_dir() else None
    if summary is not None and summary.get("status") == "running":
        write_summary(Path(run_dir), summary | {"status": "failed", "reason": f"{ABANDONED}{why}"})


def recover(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Fail RUNNING trials of dead local workers, end their probes, and retry every un-retried FAIL trial.
    ``storage``: the storage the search opened ``study`` in.

    Returns the numbers of the trials that were retried.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if dead_local_worker(t):
            try:
                storage.set_trial_state_values(storage.get_trial_id_from_study_id_trial_number(study_id, t.number),
                                               state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
    optuna.storages.fail_stale_trials(study)  # other hosts' dead workers, after the grace period
    retried, done = [], _retried(study)
    for t in study.get_trials(deepcopy=True, states=(TrialState.FAIL,)):
        run_dir = t.user_attrs.get("run_dir")
        if run_dir:
            _end_orphan_probe(run_dir)
            mark_abandoned(run_dir, f"the search was stopped during trial {t.number}; the trial was retried")
        if t.number not in done and retry_trial(study, t):
            retried.append(t.number)
    return retried


def spend_of(trial: optuna.trial.FrozenTrial, profile: Priced) -> float:
    """Probe yuan a trial spent: recorded by the objective, or for a killed trial from its run dir's file times."""
    if "probe_yuan" in trial.user_attrs:
        return float(trial.user_attrs["probe_yuan"])
    run_dir: Any = trial.user_attrs.get("run_dir")
    if trial.state != TrialState.FAIL or not run_dir or not Path(run_dir).is_dir():
        return 0.0
    return cost.probe_spend(span_s(Path(run_dir)), int(trial.user_attrs.get("devices", 1)), profile).yuan
