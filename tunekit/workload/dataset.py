"""A user's prompt set: a local JSONL or Parquet file with a prompt column and an answer column."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunekit.config.errors import ConfigError
from tunekit.workload.base import HOLD_OUT_SEED, Prompt, held_count

if TYPE_CHECKING:  # imported where a dataset file is read: a process given none skips it
    import pandas as pd

SUFFIXES = {".jsonl": "JSONL", ".json": "JSONL", ".parquet": "Parquet"}
DATA_SOURCE_COLUMN = "data_source"
"""verl's column naming where a row comes from; a reward receives it as ``data_source``."""
EXTRA_INFO_COLUMN = "extra_info"
"""verl's column of per-row facts for the reward; a mapping there is merged into the reward's ``extra_info``."""
SPLIT = "train"
"""``extra_info``'s ``split`` of a row trained on, unless the row names its own."""
HELD_OUT_SPLIT = "test"
"""``extra_info``'s ``split`` of a held-out row (``task.eval_fraction``; verl's name for its validation rows)."""


def read_table(path: str, key: str = "task.dataset") -> pd.DataFrame:
    """The file's rows; a missing, unreadable or empty file is a ConfigError naming ``key``."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        where = "" if p.is_absolute() else f" (a relative path is read from the directory tunekit runs in, {Path.cwd()})"
        raise ConfigError(f"{key} {path!r} does not exist or is not a file{where}; give a local JSONL or "
                          "Parquet file.")
    kind = SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise ConfigError(f"{key} {path!r} is neither .jsonl nor .parquet; convert it to JSON lines or Parquet.")
    try:
        rows = pd.read_parquet(p) if kind == "Parquet" else pd.read_json(p, lines=True, dtype=False)
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow raise many kinds for a malformed file
        where = bad_jsonl_line(p) if kind == "JSONL" else None
        what = where or f"{type(e).__name__}: {str(e)[:120]}"
        raise ConfigError(f"{key} {path!r} is not valid {kind} ({what}); fix the file.") from None
    if len(rows) == 0:
        raise ConfigError(f"{key} {path!r} has no rows; give a file with at least one prompt.")
    return rows


def bad_jsonl_line(path: Path) -> str | None:
    """Where a JSON-lines file first breaks: ``line N: what``, or None when every line is a JSON object."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                return f"line {n}: {e.msg} at column {e.colno}"
            if not isinstance(value, dict):
                return f"line {n}: a JSON {type(value).__name__}, not an object of columns"
    return None


class DatasetPrompts:
    """Prompts from a table: ``prompt_column`` (through ``template`` if given) and ``answer_column``.

    ``template`` is a Python format string over the row's columns, e.g. ``"Question: {prompt}\\nAnswer:"``.
    Each step draws ``n`` distinct rows with the caller's ``rng`` (with replacement only when the file has fewer
    rows than a step needs), so a seed fixes the prompts of every step. Each prompt keeps what verl hands a reward:
    the row's ``data_source`` column (else ``data_source``, the file's name) and its other columns as
    ``extra_info`` with the row's ``index`` and ``split``.
    """

    def __init__(self, rows: pd.DataFrame, *, prompt_column: str, answer_column: str, template: str | None = None,
                 source: str = "task.dataset", data_source: str = "dataset") -> None:
        records = rows.to_dict("records")
        for key, col in (("task.prompt_column", prompt_column), ("task.answer_column", answer_column)):
            try:
                cell(records[0], col)
            except KeyError:
                cols = ", ".join(map(str, rows.columns[:8]))
                raise ConfigError(f"{source} has no column {col!r} (it has: {cols}); set {key} to the right column "
                                  "(a key inside a column of mappings as column.key, e.g. reward_model.ground_truth).") from None
        used = {prompt_column, answer_column, DATA_SOURCE_COLUMN}
        self.prompts = [
            Prompt(self._text(r, prompt_column, template, source, i),
                   _cell_text(r, answer_column, "task.answer_column", source, i),
                   data_source=_as_text(r.get(DATA_SOURCE_COLUMN)) or data_source,
                   extra_info=extra_info(r, used, i), row=i)
            for i, r in enumerate(records)]
        self.held: list[Prompt] = []

    @staticmethod
    def _text(row: dict, prompt_column: str, template: str | None, source: str, index: int) -> str:
        if template is None:
            return _cell_text(row, prompt_column, "task.prompt_column", source, index)
        try:
            return template.format(**{str(k): _as_text(v) for k, v in row.items()})
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"task.prompt_template {template!r} cannot be filled from a row of {source} "
                              f"({type(e).__name__}: {e}); name only its columns in braces, e.g. {{{prompt_column}}}.") from None

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        if n <= len(self.prompts):
            return rng.sample(self.prompts, n)
        return rng.choices(self.prompts, k=n)

    def examples(self) -> list[Prompt]:
        return self.prompts + self.held

    def hold_out(self, fraction: float) -> list[Prompt]:
        """``fraction`` of the distinct prompts, never drawn for training afterwards: a prompt the file repeats is
        held out with every row of it (one of them judged), so no held-out prompt is trained on."""
        texts = list(dict.fromkeys(p.text for p in self.prompts))
        what = "rows" if len(texts) == len(self.prompts) else f"distinct prompts (of {len(self.prompts)} rows)"
        chosen = set(random.Random(HOLD_OUT_SEED).sample(texts, held_count(len(texts), fraction, what)))
        self.held = [held_out(p) for p in {p.text: p for p in self.prompts if p.text in chosen}.values()]
        self.prompts = [p for p in self.prompts if p.text not in chosen]
        return self.held

    def __len__(self) -> int:
        return len(self.prompts)


def evaluation_prompts(prompts: list[Prompt]) -> list[Prompt]:
    """An evaluation file's prompts (``task.eval_dataset``) as held-out prompts: one row of each distinct prompt, in
    an order drawn once (:data:`HOLD_OUT_SEED`), so the first ``probe.eval_prompts`` of them are a sample of the file
    rather than its head."""
    distinct = list({p.text: held_out(p) for p in prompts}.values())
    random.Random(HOLD_OUT_SEED).shuffle(distinct)
    return distinct


def held_out(prompt: Prompt) -> Prompt:
    """``prompt`` as a held-out row: where its ``split`` says it is trained on (:data:`SPLIT`), its reward is told
    :data:`HELD_OUT_SPLIT` instead; a row that names another split keeps it."""
    if prompt.extra_info.get("split") != SPLIT:
        return prompt
    return dataclasses.replace(prompt, extra_info={**prompt.extra_info, "split": HELD_OUT_SPLIT})


def extra_info(row: dict[str, Any], used: set[str], index: int) -> dict[str, Any]:
    """verl's ``extra_info`` of a row: its columns other than ``used`` (a mapping in an ``extra_info`` column merged
    in), with ``index`` and ``split`` unless the row gives its own. A cell the row leaves empty (a key its JSON line
    lacks, which pandas reads as NaN) is left out."""
    info = {str(k): v for k, v in row.items() if k not in used and k != EXTRA_INFO_COLUMN and not _empty(v)}
    nested = row.get(EXTRA_INFO_COLUMN)
    if isinstance(nested, dict):
        info |= nested
    elif nested is not None:
        info[EXTRA_INFO_COLUMN] = nested
    return {"index": index, "split": SPLIT} | info


def cell(row: dict[str, Any], name: str) -> Any:
    """The row's ``name`` column, or a key inside a column of mappings (``reward_model.ground_truth``); KeyError
    when there is neither."""
    if name in row:
        return row[name]
    head, dot, rest = name.partition(".")
    if dot and isinstance(row.get(head), dict):
        return cell(row[head], rest)
    raise KeyError(name)


def _cell_text(row: dict[str, Any], name: str, key: str, source: str, index: int) -> str:
    """The cell as text; a list or mapping there (verl's chat-message prompts, say) is a ConfigError naming ``key``."""
    try:
        value = cell(row, name)
    except KeyError:
        value = None
    if _empty(value):
        raise ConfigError(f"{source}: row {index} has no {name!r}; give every row a value for {key}.")
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        raise ConfigError(f"{source}: row {index}'s {key} {name!r} holds a {type(value).__name__} ({str(value)[:60]}), "
                          f"not text; set {key} to a column of text or a text key inside one (e.g. extra_info.question).")
    return _as_text(value)


def _empty(value) -> bool:
    """An empty cell: None, or pandas' NaN for a key a JSON line lacks."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _as_text(value) -> str:
    """A cell as text; an empty cell (:func:`_empty`) is ``""``."""
    return "" if _empty(value) else str(value)
