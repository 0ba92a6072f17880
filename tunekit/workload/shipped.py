"""Datasets tunekit ships as generators: ``task.dataset: tunekit:<name>`` names one, written once into tunekit's
cache as JSON lines (the same rows every time) and read from there like any user's file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tunekit.config.base import SHIPPED_PREFIX
from tunekit.config.errors import ConfigError
from tunekit.workload import arith_qa
from tunekit.workload.cache import cache_dir, writing

PREFIX = SHIPPED_PREFIX
SHIPPED: dict[str, Callable[[], list[dict[str, str]]]] = {
    "arith-qa": arith_qa.rows,  # two-operand arithmetic asked in words; reward tunekit.workload.arith_qa:reward
}
VERSION = 1
"""Part of every written file's name: a change to a generator writes a new file."""


def is_shipped(dataset: str | None) -> bool:
    return dataset is not None and dataset.startswith(PREFIX)


def dataset_file(dataset: str, key: str = "task.dataset") -> str:
    """The file ``key`` (``task.dataset``, ``task.eval_dataset``) reads: a shipped dataset's file in the cache
    (written now if absent), or ``dataset``."""
    if not is_shipped(dataset):
        return dataset
    name = dataset[len(PREFIX):]
    if name not in SHIPPED:
        raise ConfigError(f"{key} {dataset!r} is not a dataset tunekit ships; choose one of: "
                          f"{', '.join(PREFIX + n for n in SHIPPED)}, or give a local JSONL or Parquet file.")
    final = cache_dir() / "datasets" / f"{name}-v{VERSION}.jsonl"
    if not final.is_file():
        with writing(final) as tmp:
            tmp.write_text("".join(json.dumps(row) + "\n" for row in SHIPPED[name]()))
    return str(final)


def data_source(dataset: str) -> str:
    """The rows' ``data_source`` (what verl's reward is told): the shipped dataset's name, or the file's stem."""
    return dataset[len(PREFIX):] if is_shipped(dataset) else Path(dataset).stem
