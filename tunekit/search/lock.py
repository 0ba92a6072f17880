"""One study-wide lock for the workers of a search, held while a worker admits its next trial.

Admitting a trial reads the study (what was spent, what the running probes have reserved, which
configurations are taken), asks Optuna for the trial and records the trial's reservation; two workers
doing that at once could both pass the budget check, or both take the same configuration. The lock
makes admission one worker at a time; the probes themselves run in parallel.

PostgreSQL: a session-level advisory lock keyed by the study's name (released by the server if the
worker dies). SQLite: an exclusive ``flock`` on the database's folder (one host; not on the file itself, whose
closing would drop SQLite's own POSIX locks held in this process). Other storages: none.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any

import optuna


def _key(study_name: str) -> int:
    """A signed 64-bit advisory-lock key from the study's name."""
    return int.from_bytes(hashlib.sha256(f"tunekit-study:{study_name}".encode()).digest()[:8], "big", signed=True)


class StudyLock:
    """``acquire``/``release`` (both idempotent) of the admission lock of study ``study_name`` in ``storage`` (the
    storage the search opened)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        self._engine: Any = getattr(storage, "engine", None)  # an RDBStorage's SQLAlchemy engine
        self._key = _key(study_name)
        self._held: Any = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def acquire(self) -> None:
        if self._held is not None or self._engine is None:
            return
        dialect = self._engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy import text

            conn = self._engine.connect()
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            conn.commit()
            self._held = conn
        elif dialect == "sqlite" and self._engine.url.database:
            fd = os.open(Path(self._engine.url.database).resolve().parent, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held = fd

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        if hasattr(held, "execute"):
            from sqlalchemy import text

            try:
                held.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                held.commit()
            finally:
                held.close()
        else:
            fcntl.flock(held, fcntl.LOCK_UN)
            os.close(held)
