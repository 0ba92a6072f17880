"""One row per probe for comparing runners on one workload: steady step time by phase, tokens/s/GPU, memory.

    python3 benchmarks/runner_rows.py RUNS_DIR... --out "$OUT" [--warmup 3]

Reads each run directory's step records (``steps.parquet``, or ``steps.jsonl`` while a probe was cut short) and
summary, so a probe that passed its time limit still gives the steps it finished. Steady figures are the trainer's
steady medians over the steps after ``--warmup`` (the first steps compile and warm caches); ``first_step_s`` is the
first step on its own.
tokens/s/GPU is the steady ``perf/total_tokens`` over the steady step, per GPU held, as verl defines its throughput.
Writes ``OUT/runner_rows.json`` (one table for benchmarks/collect.py) and prints it as markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tunekit import rundir  # noqa: E402
from tunekit.profiler.phases import steady_from_steps  # noqa: E402

PHASES = ("gen", "old_logprob", "ref", "values", "update_critic", "update_actor", "update_weights")
COLUMNS = ("runner", "status", "steps", "steady_steps", "step_s", *(f"{p}_s" for p in PHASES), "tokens_per_s_per_gpu",
           "reserved_peak_gib", "nvml_peak_gib", "first_step_s", "startup_s", "wall_s")


def row(run: Path, warmup: int) -> dict | None:
    """The comparison row of one run directory; None when it recorded no step."""
    steps = rundir.read_steps(run)
    if steps.empty:
        return None
    summary = rundir.read_summary(run) or {}
    config = rundir.read_config(run)
    # the trainer's own steady medians (tunekit.profiler.phases), over the steps this probe finished
    steady = steady_from_steps(steps, warmup) if len(steps) > warmup else {}
    step_s, tokens = steady.get("timing_s/step"), steady.get("perf/total_tokens")
    gpus = summary.get("gpus_held") or config.system.world_size
    nvml = [v for k, v in summary.items() if k.startswith("nvml/mem_used_gb/") and isinstance(v, (int, float))]
    out = {"runner": config.runner, "run": run.name, "status": summary.get("status"), "steps": len(steps),
           "steady_steps": max(len(steps) - warmup, 0), "step_s": step_s,
           **{f"{p}_s": steady.get(f"timing_s/{p}") for p in PHASES},
           "tokens_per_s_per_gpu": tokens / step_s / gpus if tokens and step_s else None,
           "reserved_peak_gib": float(steps["perf/max_memory_reserved_gb"].max()) if "perf/max_memory_reserved_gb" in steps else None,
           "nvml_peak_gib": max(nvml) if nvml else None,
           "first_step_s": float(steps["timing_s/step"].iloc[0]) if "timing_s/step" in steps and len(steps) else None,
           "startup_s": summary.get("startup_s"), "wall_s": summary.get("wall_s")}
    return out


def rows(folders: list[Path], warmup: int) -> list[dict]:
    """Rows of every run directory under ``folders``, in the order the probes started (their ids begin with the time)."""
    runs = sorted({d for f in folders for d in rundir.find_run_dirs(f) if (d / rundir.CONFIG).exists()}, key=lambda p: p.name)
    return [r for r in (row(d, warmup) for d in runs) if r is not None]


def markdown(found: list[dict]) -> str:
    shown = [c for c in COLUMNS if any(r.get(c) is not None for r in found)]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in found:
        cells = [r[c] if isinstance(r[c], (str, int)) or r[c] is None else f"{r[c]:,.0f}" if r[c] >= 1000 else f"{r[c]:.3g}"
                 for c in shown]
        lines.append("| " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="runs directories (or folders above them)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the steady medians (default 3)")
    args = ap.parse_args()
    found = rows(args.folders, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runner_rows.json").write_text(json.dumps({"warmup": args.warmup, "rows": found}, indent=1))
    print(markdown(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
