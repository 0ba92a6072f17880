"""The run directory: config.yaml, steps.parquet (one row per step), summary.json.

These files are the contract between a probe and everything that reads it
(cost, search, report). Writers live here; readers only need pandas + json.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

STATUSES = ("ok", "oom", "timeout", "failed", "running")

RUN_DIR_ENV = "TUNEKIT_RUN_DIR"
"""Set to the run directory in every process of a probe (inherited, Ray's workers too): the tag that finds them."""


def new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.getpid() % 10000:04d}{time.time_ns() % 1000:03d}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    tmp.replace(path)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / "summary.json"
    return json.loads(p.read_text()) if p.exists() else None


class StepLog:
    """Rows of per-step metrics; appended to steps.jsonl as they come (progress + crash safety),
    and written to steps.parquet on :meth:`flush`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.rows: list[dict[str, float]] = []
        self._jsonl = self.run_dir / "steps.jsonl"

    def append(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        with self._jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        if self.rows:
            pd.DataFrame(self.rows).to_parquet(self.run_dir / "steps.parquet", index=False)


def read_steps(run_dir: Path) -> pd.DataFrame:
    """steps.parquet, or the partial steps.jsonl of a probe that died."""
    run_dir = Path(run_dir)
    if (run_dir / "steps.parquet").exists():
        return pd.read_parquet(run_dir / "steps.parquet")
    if (run_dir / "steps.jsonl").exists():
        return pd.read_json(run_dir / "steps.jsonl", lines=True)
    return pd.DataFrame()


def steps_done(run_dir: Path) -> int:
    p = Path(run_dir) / "steps.jsonl"
    if not p.exists():
        return 0
    with p.open() as f:
        return sum(1 for _ in f)


def profiler_seconds(steps: pd.DataFrame) -> float:
    """The profiler's own time over a probe's steps (``profiler/overhead_s``, kept out of the step times)."""
    return float(steps["profiler/overhead_s"].sum()) if "profiler/overhead_s" in steps else 0.0


def timed_steps(sampled: list[bool]) -> list[bool]:
    """Which steady steps' times describe a training run: those not sampled for communication (the profiler's
    trace slows the steps it watches; a training run is not profiled), or every one if all were sampled."""
    return [True] * len(sampled) if all(sampled) else [not s for s in sampled]


def projection_step_times(steps: pd.DataFrame, warmup_steps: int) -> list[float]:
    """Step times a projection reads: the warm-up steps, then the steady steps :func:`timed_steps` keeps."""
    times = steps["timing_s/step"].tolist()
    if "comm/sampled" not in steps:
        return times
    sampled = steps["comm/sampled"].fillna(0).astype(bool).tolist()
    keep = [True] * warmup_steps + timed_steps(sampled[warmup_steps:])
    return [t for t, k in zip(times, keep) if k]
