"""verl's per-step metrics as tunekit's step records.

verl's trainer logs one dict per step through its ``Tracking`` backends: the ``file`` backend appends
``{"step": N, "data": {...}}`` as one JSON line to ``VERL_FILE_LOGGER_PATH`` (what a probe reads, as it grows),
the ``console`` backend prints ``step:N - key:value - ...``. verl counts steps from 1, tunekit from 0.

verl's names -> tunekit's (the phases are verl's ``marked_timer`` sections, which tunekit's names follow):

- ``timing_s/<phase>``: the same name for the phases of :data:`tunekit.metrics.PHASES` (``old_log_prob`` becomes
  ``old_logprob``); verl's other sections (validation, checkpoints, dumps, a worker's own sub-timers) stay in verl's
  own log only. In verl's synchronous V1 trainer
  ``gen`` is waiting for the step's rollouts (the agent loop, which also scores them with the reward workers) and
  putting the engine to sleep; ``update_weights`` is waking it and loading the actor's weights, at the step's end.
- ``critic/score/mean`` (the task reward, before any KL penalty) -> ``reward/mean``.
- ``perf/total_num_tokens`` (prompt + response tokens of the step) -> ``perf/total_tokens``; tunekit derives
  ``perf/throughput`` from it as verl does.
- ``perf/max_memory_allocated_gb`` / ``_reserved_gb``: the largest a worker reported (the actor's and the critic's
  update log them, as ``actor/perf/...`` and ``critic/perf/...``).
- ``rollout/tokens_per_s``: response tokens of the step over ``timing_s/gen``.
- ``val-core/<data_source>/reward/mean@N`` (verl's validation on the held-out prompts; ``val-aux/...`` where the
  reward returned an ``acc``; a data source may hold ``/``), averaged over data sources -> ``eval/reward_mean``; its
  section ``timing_s/testing`` -> ``eval/time_s``. verl's V1 trainer validates after its ``step`` timer has closed,
  so ``timing_s/step`` holds none of it.
- verl writes each step's rollouts for the probe's samples (:func:`read_generations`) in a background thread, after
  the step's timer and possibly after its metrics line, and prints :data:`DUMPED` once a file is whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tunekit import metrics

_SAME = ("response_length/mean", "actor/entropy", "actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/pg_clipfrac",
         "actor/pg_clipfrac_lower", "actor/ppo_kl", "critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm",
         *(metrics.timing(p) for p in (*metrics.PHASES, "step") if p != "old_logprob"))
RENAMES = dict(zip(_SAME, _SAME)) | {
    "timing_s/old_log_prob": metrics.timing("old_logprob"), "critic/score/mean": metrics.REWARD_MEAN,
    "perf/total_num_tokens": metrics.TOTAL_TOKENS, "actor/kl_loss": metrics.REF_KL,
    "actor/reward_kl_penalty": metrics.REF_KL}
"""verl's names a step row keeps, each under tunekit's (:mod:`tunekit.metrics`); the rest stay in verl's own log."""
MEMORY = (metrics.MAX_ALLOCATED_GB, metrics.MAX_RESERVED_GB)
TESTING_PHASE = "timing_s/testing"
_VAL_REWARD = re.compile(r"val-(core|aux)/(.+)/reward/mean@\d+")
DUMPED = re.compile(r"Dumped generations to (\S+\.jsonl)")
"""verl's line once a dump of rollouts is whole on disk (``_write_generations``)."""


def eval_reward(logged: dict[str, Any]) -> float | None:
    """verl's validation reward in a step's metrics: the mean over data sources of ``val-core/<source>/reward/mean@N``
    (``val-aux`` where ``reward`` is not the core variable); None on a step without validation."""
    by_source: dict[str, float] = {}
    for key, value in sorted(logged.items(), key=lambda kv: kv[0].startswith("val-core")):  # core last: it wins
        m = _VAL_REWARD.fullmatch(key)
        if m and isinstance(value, (int, float)) and not isinstance(value, bool):
            by_source[m.group(2)] = float(value)
    return sum(by_source.values()) / len(by_source) if by_source else None


def read_generations(path: Path) -> tuple[list[str], list[str], list[str | None], list[float]]:
    """One step's rollouts as verl dumps them (``trainer.rollout_data_dir/<step>.jsonl``, a line per response with
    ``input``, ``output``, ``score`` and, in the verl versions that write it, ``gts``): (prompts, responses,
    answers, rewards), row-aligned; an answer is None where verl wrote none."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return ([str(x["input"]) for x in lines], [str(x["output"]) for x in lines],
            [None if x.get("gts") is None else str(x["gts"]) for x in lines], [float(x["score"]) for x in lines])


def step_row(step: int, logged: dict[str, Any], samples_per_step: int) -> dict[str, float] | None:
    """verl's metrics of its step ``step`` (from 1) as tunekit's row, or None for a line that is no training step
    (validation before training logs without ``timing_s/step``)."""
    if not isinstance(logged.get(metrics.TIMING_STEP), (int, float)):
        return None
    row: dict[str, float] = {metrics.STEP: float(step - 1)}
    for key, value in logged.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key in RENAMES:
            row[RENAMES[key]] = float(value)
    for name in MEMORY:
        peaks = [float(v) for k, v in logged.items() if k.removeprefix("actor/").removeprefix("critic/") == name
                 and isinstance(v, (int, float))]
        if peaks:
            row[name] = max(peaks)
    seconds = logged.get(TESTING_PHASE)
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        row[metrics.EVAL_TIME_S] = float(seconds)
    if (held_out := eval_reward(logged)) is not None:
        row[metrics.EVAL_REWARD_MEAN] = held_out
    gen = row.get(metrics.timing("gen"))
    if metrics.RESPONSE_LENGTH_MEAN in row and gen:
        row[metrics.ROLLOUT_TOKENS_PER_S] = row[metrics.RESPONSE_LENGTH_MEAN] * samples_per_step / gen
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
    values: dict[str, float] = {}
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
            values[key] = value
    return int(m.group(1)), values
