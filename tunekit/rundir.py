"""The run directory ``runs/<id>/``: every file a probe writes, its writers and readers, and the statuses.

These files are the contract between a probe's processes, the launcher and everything that reads a probe
(cost, search, estimate, report); nobody else spells their names. Who writes what:

=================  ==========================================================================================
file               written by, and what it holds
=================  ==========================================================================================
config.yaml        the launcher, before the probe starts: the fully resolved recipe
steps.jsonl        rank 0 (or the driver), one line per step as it finishes: progress, and what a killed
                   probe leaves
steps.parquet      rank 0 (or the driver): the same rows, every 10 steps and at the end
result.json        rank 0 (or the driver), when the steps are done: startup, steady medians, profiler summary
error-rank<R>.json a rank (or the driver) that failed: its status (oom / failed) and message
nvml.parquet       the NVML sampler on the main rank (GPU probes)
log.txt            the launcher: every process's output
summary.json       the launcher: ``running`` while the probe runs, then its status, reason, cost and medians
ray.json,          the single-controller driver: its Ray cluster and where each role worker runs
workers.json
traces/rank<R>/    the profiler, with ``profiler.trace``: torch.profiler traces of the sampled steps
<name>.log,        a server a probe started: its output, and its process group (removed when it stops)
<name>.pgid
<runner>/          a runner's framework output during the probe (TRL's output_dir), removed at its end
=================  ==========================================================================================

Beside the run directories, ``.compile-cache/`` holds torch.compile's caches for the compiled probes written to
that directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal, get_args

import pandas as pd
import yaml

from tunekit.config import Recipe, dump_recipe, validate

CONFIG = "config.yaml"
STEPS = "steps.parquet"
STEPS_LIVE = "steps.jsonl"
RESULT = "result.json"
NVML = "nvml.parquet"
LOG = "log.txt"
SUMMARY = "summary.json"
RAY = "ray.json"
WORKERS = "workers.json"
TRACES = "traces"
PGID_SUFFIX = ".pgid"
_ERRORS = "error-rank*.json"

COMPILE_CACHE = ".compile-cache"
"""Beside the run directories, not in one: torch.compile's caches, shared by the compiled probes written to one
directory (a search's)."""

RUN_DIR_ENV = "TUNEKIT_RUN_DIR"
"""Set to the run directory in every process of a probe (inherited, Ray's workers too): the tag that finds them."""

Status = Literal["running", "ok", "oom", "timeout", "failed", "pruned"]
"""A probe's ``summary.json`` status: ``running`` until the launcher records how it ended; ``pruned`` when a
search stopped it early on cost."""
STATUSES: tuple[str, ...] = get_args(Status)


def compile_cache_dir(run_dir: Path) -> Path:
    """The compile cache that ``run_dir``'s probe shares with the other probes of its output directory."""
    return Path(run_dir).resolve().parent / COMPILE_CACHE


def new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.getpid() % 10000:04d}{time.time_ns() % 1000:03d}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    tmp.replace(path)


# ------------------------------------------------------------------ config.yaml


def write_config(run_dir: Path, recipe: Recipe) -> None:
    (Path(run_dir) / CONFIG).write_text(dump_recipe(recipe))


def read_config(run_dir: Path) -> Recipe:
    """The probe's resolved recipe (a TunekitError if it is not one)."""
    path = Path(run_dir) / CONFIG
    return validate(yaml.safe_load(path.read_text()), str(path))


def find_configs(root: Path) -> list[Path]:
    """Every run directory's config.yaml under ``root``."""
    return sorted(Path(root).rglob(CONFIG))


# ------------------------------------------------------------------ summary.json, result.json, errors


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_json(Path(run_dir) / SUMMARY, summary)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / SUMMARY
    return json.loads(p.read_text()) if p.exists() else None


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    write_json(Path(run_dir) / RESULT, result)


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """result.json, or None when the probe did not finish its steps."""
    p = Path(run_dir) / RESULT
    return json.loads(p.read_text()) if p.exists() else None


def write_error(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    """A failed rank's record: ``status`` (oom / failed), ``message``, optionally ``traceback``."""
    write_json(Path(run_dir) / f"error-rank{rank}.json", record)


def read_errors(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(Path(run_dir).glob(_ERRORS))]


def log_tail(run_dir: Path, n: int) -> list[str]:
    p = Path(run_dir) / LOG
    return p.read_text(errors="replace").strip().splitlines()[-n:] if p.exists() else []


# ------------------------------------------------------------------ steps


class StepLog:
    """Rows of per-step metrics; appended to steps.jsonl as they come (progress + crash safety),
    and written to steps.parquet on :meth:`flush`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.rows: list[dict[str, float]] = []
        self._jsonl = self.run_dir / STEPS_LIVE

    def append(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        with self._jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        if self.rows:
            pd.DataFrame(self.rows).to_parquet(self.run_dir / STEPS, index=False)


def read_steps(run_dir: Path) -> pd.DataFrame:
    """steps.parquet, or the partial steps.jsonl of a probe that died."""
    run_dir = Path(run_dir)
    if (run_dir / STEPS).exists():
        return pd.read_parquet(run_dir / STEPS)
    if (run_dir / STEPS_LIVE).exists():
        return pd.read_json(run_dir / STEPS_LIVE, lines=True)
    return pd.DataFrame()


def steps_done(run_dir: Path) -> int:
    p = Path(run_dir) / STEPS_LIVE
    if not p.exists():
        return 0
    with p.open() as f:
        return sum(1 for _ in f)


def live_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of the steps a running probe has finished so far (steps.jsonl; a half-written last line is left out)."""
    p = Path(run_dir) / STEPS_LIVE
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip().endswith("}")]


# ------------------------------------------------------------------ the rest


def nvml_path(run_dir: Path) -> Path:
    return Path(run_dir) / NVML


def log_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOG


def trace_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TRACES / f"rank{rank}"


def framework_dir(run_dir: Path, name: str) -> Path:
    """Where a runner's framework writes its own output during a probe (removed at the end; nothing is kept)."""
    return Path(run_dir) / name


def server_files(run_dir: Path, name: str) -> tuple[Path, Path]:
    """The log and the process-group file of a server named ``name`` that a probe starts."""
    return Path(run_dir) / f"{name}.log", Path(run_dir) / f"{name}{PGID_SUFFIX}"


def server_groups(run_dir: Path) -> list[Path]:
    """Process-group files of the servers a probe started and has not stopped."""
    return sorted(Path(run_dir).glob(f"*{PGID_SUFFIX}"))
