"""A user's prompt set: a local JSONL or Parquet file with a prompt column and an answer column."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from tunekit.errors import ConfigError
from tunekit.workload.base import Prompt

SUFFIXES = {".jsonl": "JSONL", ".json": "JSONL", ".parquet": "Parquet"}


def read_table(path: str) -> pd.DataFrame:
    """The file's rows; a missing, unreadable or empty file is a ConfigError naming ``task.dataset``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"task.dataset {path!r} does not exist or is not a file; give a local JSONL or Parquet file.")
    kind = SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise ConfigError(f"task.dataset {path!r} is neither .jsonl nor .parquet; convert it to JSON lines or Parquet.")
    try:
        rows = pd.read_parquet(p) if kind == "Parquet" else pd.read_json(p, lines=True, dtype=False)
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow raise many kinds for a malformed file
        raise ConfigError(f"task.dataset {path!r} is not valid {kind} ({type(e).__name__}: {str(e)[:120]}); fix the file.") from None
    if len(rows) == 0:
        raise ConfigError(f"task.dataset {path!r} has no rows; give a file with at least one prompt.")
    return rows


class DatasetPrompts:
    """Prompts from a table: ``prompt_column`` (through ``template`` if given) and ``answer_column``.

    ``template`` is a Python format string over the row's columns, e.g. ``"Question: {prompt}\\nAnswer:"``.
    Each step draws ``n`` distinct rows with the caller's ``rng`` (with replacement only when the file has fewer
    rows than a step needs), so a seed fixes the prompts of every step.
    """

    def __init__(self, rows: pd.DataFrame, *, prompt_column: str, answer_column: str, template: str | None = None,
                 source: str = "task.dataset") -> None:
        for key, col in (("task.prompt_column", prompt_column), ("task.answer_column", answer_column)):
            if col not in rows.columns:
                cols = ", ".join(map(str, rows.columns[:8]))
                raise ConfigError(f"{source} has no column {col!r} (it has: {cols}); set {key} to the right column.")
        records = rows.to_dict("records")
        self.prompts = [Prompt(self._text(r, prompt_column, template, source), _as_text(r[answer_column]))
                        for r in records]

    @staticmethod
    def _text(row: dict, prompt_column: str, template: str | None, source: str) -> str:
        if template is None:
            return _as_text(row[prompt_column])
        try:
            return template.format(**{str(k): _as_text(v) for k, v in row.items()})
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"task.prompt_template {template!r} cannot be filled from a row of {source} "
                              f"({type(e).__name__}: {e}); name only its columns in braces, e.g. {{{prompt_column}}}.") from None

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        if n <= len(self.prompts):
            return rng.sample(self.prompts, n)
        return rng.choices(self.prompts, k=n)

    def __len__(self) -> int:
        return len(self.prompts)


def _as_text(value) -> str:
    return "" if value is None else str(value)
