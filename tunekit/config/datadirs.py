"""Where the shipped ``recipes/`` and ``profiles/`` are: beside the package in a checkout (an editable
install), else under ``<prefix>/share/tunekit/`` where a wheel install puts them (pyproject's data-files)."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def data_dir(name: str) -> Path:
    beside = Path(__file__).resolve().parents[2] / name
    if beside.is_dir():
        return beside
    return Path(sysconfig.get_path("data")) / "share" / "tunekit" / name
