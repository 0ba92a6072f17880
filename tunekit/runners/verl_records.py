"""verl's per-step metrics as tunekit's step records.

verl's trainer logs one dict per step through its ``Tracking`` backends: the ``file`` backend appends
``{"step": N, "data": {...}}`` as one JSON line to ``VERL_FILE_LOGGER_PATH`` (what a probe reads, as it grows),
the ``console`` backend prints ``step:N - key:value - ...``. verl counts steps from 1, tunekit from 0.

verl's names -> tunekit's (the phases are verl's ``marked_timer`` sections, which tunekit's names follow):

- ``timing_s/<phase>``: the same name; ``old_log_prob`` becomes ``old_logprob``. In verl's synchronous V1 trainer
  ``gen`` is waiting for the step's rollouts (the agent loop, which also scores them with the reward workers) and
  putting the engine to sleep; ``update_weights`` is waking it and loading the actor's weights, at the step's end.
- ``critic/score/mean`` (the task reward, before any KL penalty) -> ``reward/mean``.
- ``perf/total_num_tokens`` (prompt + response tokens of the step) -> ``perf/total_tokens``; tunekit derives
  ``perf/throughput`` from it as verl does.
- ``perf/max_memory_allocated_gb`` / ``_reserved_gb``: the largest a worker reported (the actor's and the critic's
  update log them, as ``actor/perf/...`` and ``critic/perf/...``).
- ``rollout/tokens_per_s``: response tokens of the step over ``timing_s/gen``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RENAMES = {"timing_s/old_log_prob": "timing_s/old_logprob", "critic/score/mean": "reward/mean",
           "perf/total_num_tokens": "perf/total_tokens", "response_length/mean": "response_length/mean",
           "actor/entropy": "actor/entropy", "actor/pg_loss": "actor/pg_loss", "actor/grad_norm": "actor/grad_norm",
           "actor/pg_clipfrac": "actor/pg_clipfrac", "actor/kl_loss": "actor/ref_kl",
           "actor/reward_kl_penalty": "actor/ref_kl"}
"""verl names kept under tunekit's name (besides every ``timing_s/*``)."""
MEMORY = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
SKIPPED_PHASES = ("timing_s/testing", "timing_s/save_checkpoint", "timing_s/dump_rollout_generations")


def step_row(step: int, metrics: dict[str, Any], samples_per_step: int) -> dict[str, float] | None:
    """verl's metrics of its step ``step`` (from 1) as tunekit's row, or None for a line that is no training step
    (validation before training logs without ``timing_s/step``)."""
    if not isinstance(metrics.get("timing_s/step"), (int, float)):
        return None
    row: dict[str, float] = {"step": float(step - 1)}
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key in RENAMES:
            row[RENAMES[key]] = float(value)
        elif key.startswith("timing_s/") and key not in SKIPPED_PHASES:
            row[key] = float(value)
    for name in MEMORY:
        peaks = [float(v) for k, v in metrics.items() if k.removeprefix("actor/").removeprefix("critic/") == name
                 and isinstance(v, (int, float))]
        if peaks:
            row[name] = max(peaks)
    gen = row.get("timing_s/gen")
    if "response_length/mean" in row and gen:
        row["rollout/tokens_per_s"] = row["response_length/mean"] * samples_per_step / gen
    return row


class MetricsFile:
    """verl's file-logger JSONL read as it grows: :meth:`read` returns the steps written since the last call
    (a half-written last line waits for its end)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def read(self) -> list[tuple[int, dict[str, Any]]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        out = []
        for line in lines:
            if line.strip():
                record = json.loads(line)
                out.append((int(record["step"]), dict(record.get("data") or {})))
        return out


_CONSOLE_STEP = re.compile(r"(?:^|\s)step:(\d+) - ")
_WRAPPED = re.compile(r"[\w.]+\((.*)\)")  # numpy's repr: np.float64(0.5)


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """One line of verl's console logger (``step:N - key:value - ...``) as (step, metrics), else None. Values
    printed as ``np.float64(x)`` are read as x."""
    m = _CONSOLE_STEP.search(line)
    if m is None:
        return None
    metrics: dict[str, float] = {}
    for part in line[m.end():].rstrip().split(" - "):
        key, sep, text = part.rpartition(":")
        text = text.strip()
        if (wrapped := _WRAPPED.fullmatch(text)) is not None:
            text = wrapped.group(1)
        try:
            value = float(text)
        except ValueError:
            continue
        if key and sep:
            metrics[key] = value
    return int(m.group(1)), metrics
