"""tunekit's cache directory (converted models, generated datasets, downloaded wheels), and writing into it so that a
killed writer leaves nothing half-written."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "TUNEKIT_CACHE"
PARTIAL = ".partial-"


def cache_dir() -> Path:
    """``$TUNEKIT_CACHE``, else ``$XDG_CACHE_HOME/tunekit``, else ``~/.cache/tunekit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tunekit"


@contextmanager
def scratch(folder: Path) -> Iterator[Path]:
    """A fresh hidden directory in ``folder``, removed when the block ends however it ends. A killed process leaves
    it (``.partial-<pid>-…``); the next one made in the same folder removes it once that process is gone."""
    folder.mkdir(parents=True, exist_ok=True)
    _sweep(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f"{PARTIAL}{os.getpid()}-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A :func:`scratch` directory beside ``final`` to build it in, renamed to ``final`` when the block ends without
    an error: ``final`` appears whole or not at all. When another process finished ``final`` first, its copy is
    kept."""
    with scratch(final.parent) as tmp:
        yield tmp
        for f in tmp.rglob("*"):  # what a library wrote privately (transformers' weights: 0600) is read by others too
            f.chmod(0o755 if f.is_dir() else 0o644)
        tmp.chmod(0o755)  # mkdtemp's folder is private; the finished one reads like any other
        try:
            tmp.rename(final)
        except OSError:
            if not final.exists():
                raise


@contextmanager
def writing(final: Path) -> Iterator[Path]:
    """A path in a :func:`scratch` directory beside ``final`` to write the file at, moved to ``final`` when the block
    ends without an error: ``final`` appears whole or not at all."""
    with scratch(final.parent) as tmp:
        yield tmp / final.name
        os.replace(tmp / final.name, final)


def _sweep(folder: Path) -> None:
    """Remove the partial builds in ``folder`` whose process is no longer running."""
    for p in folder.glob(f"{PARTIAL}*"):
        pid = p.name[len(PARTIAL):].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
