"""One offline HTML report comparing probes: load records → pure data → plotly figures → one page.

The only package that imports plotly. Reads records only; never runs a probe.
"""

from __future__ import annotations

import os
from pathlib import Path

from tunekit.config.errors import TunekitError

__all__ = ["build_report"]


def check_output(out: Path | str) -> None:
    """Fail before any work when ``out`` can't become a file: it is or names a directory (a trailing slash), or its
    folder can't be made or written. A folder that does not exist yet is fine: the report creates it."""
    if isinstance(out, str) and out.endswith(("/", os.sep)):
        raise TunekitError(f"-o {out} names a folder; give a file name such as {Path(out) / 'report.html'}.")
    out = Path(out)
    if out.is_dir():
        raise TunekitError(f"-o {out} is a directory; give a file name such as {out / 'report.html'}.")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise TunekitError(f"-o {out}: {parent} is a file, not a folder; choose another output path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TunekitError(f"-o {out}: {parent} is not writable; choose another output path.")


def check_paths(paths: list[Path]) -> None:
    """Fail before any work when a PATH to report on does not exist."""
    for root in paths:
        if not Path(root).exists():
            raise TunekitError(f"{root} does not exist; give a runs directory or a search output directory.")


def write_atomic(out: Path, text: str) -> None:
    """Write to a temporary file beside ``out`` and rename it, so a failure leaves no half-written report."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise TunekitError(f"-o {out} can't be written ({e.strerror or e}); choose another output path.") from None


def build_report(paths: list[Path], out: Path | str, *, storage: str | None = None, study: str | None = None) -> Path:
    """Read the runs under ``paths`` (and a study), write one self-contained HTML file to ``out``, return it.

    Raises TunekitError, with nothing written, for a path without runs, an output that
    can't be written, or a study that can't be opened.
    """
    check_output(out)
    check_paths(paths)
    from tunekit.report.load import load_records  # pandas, plotly: after the arguments are checked
    from tunekit.report.page import render

    out = Path(out)
    records = load_records([Path(p) for p in paths], storage=storage, study=study)
    if not records.probes and (records.study is None or not records.study.trials):
        raise TunekitError("found no probes and no trials to report on; run `tunekit probe` or `tunekit search` first.")
    sources = [str(p) for p in paths] or [records.study.storage if records.study else ""]
    write_atomic(out, render(records, sources=sources))
    return out
