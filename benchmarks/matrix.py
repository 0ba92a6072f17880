"""Run a list of probe configurations one after another (each its own process tree) and tabulate them.

    PYTHONPATH=. python3 benchmarks/matrix.py SUITE [--out DIR]

Suites are literal lists below; each row is (label, recipe, overrides). Results go to
``DIR/<suite>.json`` (every summary) and ``DIR/<suite>.md`` (the table). Comparisons are
made inside one run on one machine: quote ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from tunekit.config import load_recipe
from tunekit.probe import run_probe

ALL2 = "{actor: [0,1], critic: [0,1], ref: [0,1], rollout: [0,1], reward: [0,1]}"
ALL1 = "{actor: [0], critic: [0], ref: [0], rollout: [0], reward: [0]}"
SPLIT = "{actor: [0], critic: [0], ref: [0], rollout: [1], reward: [1]}"
GPU_BASE = ["probe.steps=6", "probe.warmup_steps=2", "system.batch.prompts_per_step=64", "system.batch.micro_batch_size=16"]

SUITES: dict[str, list[tuple[str, str | None, list[str]]]] = {
    # issue 3 + 5: controller / device map on 2 GPUs, 1 vs 2 GPU scaling, profiler on vs minimal
    "distributed": [
        ("spmd-1gpu", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL1}"]),
        ("spmd-2gpu", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL2}"]),
        ("spmd-2gpu-profiler-min", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL2}", "profiler.comm_steps=0", "profiler.nvml_interval_s=5"]),
        ("single-colocated", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={ALL2}"]),
        ("single-split", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={SPLIT}"]),
        ("spmd-2gpu-1.5b", "qwen2.5-1.5b", GPU_BASE + [f"system.device_map={ALL2}"]),
    ],
    # issue 2: the embedded default learns, 3 seeds, PPO and GRPO (CPU, 100 steps each)
    "learning": [
        ("ppo-seed0", None, ["probe.seed=0"]),
        ("ppo-seed1", None, ["probe.seed=1"]),
        ("ppo-seed2", None, ["probe.seed=2"]),
        ("grpo-seed0", "tiny-grpo", ["probe.seed=0"]),
    ],
    # CPU smoke of the same harness
    "cpu": [
        ("spmd-1", None, ["probe.steps=4", "system.batch.prompts_per_step=8"]),
        ("spmd-2", None, ["probe.steps=4", "system.batch.prompts_per_step=8", f"system.device_map={ALL2}"]),
    ],
}

COLUMNS = ["status", "steps", "wall_s", "reward_first10", "reward_last10", "startup_s", "timing_s/step", "timing_s/gen", "timing_s/ref", "timing_s/values",
           "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights", "perf/max_memory_reserved_gb",
           "nvml_peak_gb", "comm_total_s", "comm_exposed_s", "cost/projected_yuan"]


def row_of(label: str, s: dict) -> dict:
    steady = s.get("steady", {})
    nvml = [v for k, v in s.items() if k.startswith("nvml/mem_used_gb/") and v is not None]
    comm_total = sum(v for k, v in steady.items() if k.startswith("comm/total_s/"))
    comm_exposed = sum(v for k, v in steady.items() if k.startswith("comm/exposed_s/"))
    row = {"label": label, **{k: s.get(k) for k in ("status", "steps", "wall_s", "reward_first10", "reward_last10", "startup_s", "cost/projected_yuan")}}
    row |= {k: steady.get(k) for k in COLUMNS if k.startswith(("timing_s/", "perf/"))}
    row |= {"nvml_peak_gb": max(nvml) if nvml else None, "comm_total_s": comm_total, "comm_exposed_s": comm_exposed}
    if s.get("status") != "ok":
        row["reason"] = s.get("reason")
    return row


def to_markdown(rows: list[dict]) -> str:
    cols = ["label"] + COLUMNS
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    lines += [f"\n- {r['label']}: {r['reason']}" for r in rows if r.get("reason")]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    args = ap.parse_args()
    if args.suite not in ("cpu", "learning") and not torch.cuda.is_available():
        print(f"suite {args.suite} needs an NVIDIA GPU and none is visible; run it on the GPU machine.", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, summaries = [], {}
    for label, recipe, overrides in SUITES[args.suite]:
        if args.only and label not in args.only:
            continue
        if "single" in label and torch.cuda.device_count() < 2 and "[1]" in " ".join(overrides):
            continue
        result = run_probe(load_recipe(recipe, overrides), out=out / "runs", run_id=label)
        summaries[label] = result.summary
        rows.append(row_of(label, result.summary))
        print(json.dumps(rows[-1]), flush=True)
        (out / f"{args.suite}.json").write_text(json.dumps(summaries, indent=1, default=str))
        (out / f"{args.suite}.md").write_text(to_markdown(rows))
    print(to_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
