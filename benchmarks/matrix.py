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
from tunekit.launch.probe import run_probe

ALL2 = "{actor: [0,1], critic: [0,1], ref: [0,1], rollout: [0,1], reward: [0,1]}"
ALL1 = "{actor: [0], critic: [0], ref: [0], rollout: [0], reward: [0]}"
SPLIT = "{actor: [0], critic: [0], ref: [0], rollout: [1], reward: [1]}"
GPU_BASE = ["probe.steps=6", "probe.warmup_steps=2", "system.batch.prompts_per_step=64", "system.batch.micro_batch_size=16",
            "probe.timeout_s=300", "probe.stall_timeout_s=150"]

# 1.5B: 64 prompts x 256 fixed new tokens, micro-batch 32 (the update phases are what these rows compare)
B15 = GPU_BASE + ["task.max_new_tokens=256", "system.batch.micro_batch_size=32"]
# projection fidelity: a cheap step (0.5B, 8 prompts x 4 new tokens), probe 100 steps -> run 500 steps (4000 samples)
FID = ["probe.warmup_steps=3", "run.samples=4000", "system.batch.prompts_per_step=8",
       "system.batch.micro_batch_size=8", "task.max_new_tokens=4", f"system.device_map={ALL1}"]
FULL_RUN = ["probe.steps=500", "profiler.comm_steps=0", "profiler.nvml_interval_s=1"]  # a training run: no profiling
FID_CONFIGS = {"a-ppo": [], "b-ppo-ckpt": ["system.memory.gradient_checkpointing=true"],
               "c-grpo": ["algorithm.name=grpo", "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2"],
               "d-grpo-ckpt": ["algorithm.name=grpo", "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2",
                               "system.memory.gradient_checkpointing=true"]}
# profiler overhead: the same probe with the profiler fully on (phase timers, NVML every 0.2 s, torch.profiler
# windows on 3 steps) and minimal (phase timers, NVML every 5 s), one after the other on one GPU
PROFILER_MIN = ["profiler.comm_steps=0", "profiler.nvml_interval_s=5"]
OVH15 = ["probe.steps=20", "probe.warmup_steps=3", "probe.timeout_s=300", "system.batch.prompts_per_step=64",
         "system.batch.micro_batch_size=32", "task.max_new_tokens=32", f"system.device_map={ALL1}"]
OVH_SMALL = FID + ["probe.steps=40", "probe.timeout_s=200"]  # launch-bound: 0.5B, 8 prompts x 4 new tokens
# cost growth: one configuration (0.5B, hf, 1 GPU), prompts per step and generation length doubled
GROW = ["probe.steps=3", "probe.warmup_steps=1", "profiler.comm_steps=0", "system.batch.micro_batch_size=16", f"system.device_map={ALL1}"]

SUITES: dict[str, list[tuple[str, str | None, list[str]]]] = {
    # controller / device map on 2 GPUs, 1 vs 2 GPU scaling, profiler on vs minimal
    "distributed": [
        ("spmd-1gpu", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL1}"]),
        ("spmd-2gpu", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL2}"]),
        ("spmd-2gpu-profiler-min", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL2}", "profiler.comm_steps=0", "profiler.nvml_interval_s=5"]),
        ("single-colocated", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={ALL2}"]),
        ("single-split", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={SPLIT}"]),
        ("spmd-2gpu-1.5b", "qwen2.5-1.5b", GPU_BASE + [f"system.device_map={ALL2}"]),
    ],
    # 1.5B on 1 vs 2 GPUs (update-phase scaling, MFU), profiler fully on vs minimal
    "gpu15": [
        ("1.5b-spmd1", "qwen2.5-1.5b", B15 + [f"system.device_map={ALL1}"]),
        ("1.5b-spmd1-profiler-min", "qwen2.5-1.5b", B15 + [f"system.device_map={ALL1}", "profiler.comm_steps=0",
                                                          "profiler.nvml_interval_s=5"]),
        ("1.5b-spmd2", "qwen2.5-1.5b", B15 + [f"system.device_map={ALL2}"]),
    ],
    "overhead": [("1.5b-profiler-min", "qwen2.5-1.5b", OVH15 + PROFILER_MIN), ("1.5b-profiler-on", "qwen2.5-1.5b", OVH15)],
    # the same comparison on the CPU default (embedded model, 100 steps), twice in alternation
    "overhead-cpu": [(f"cpu-profiler-{mode}-{k}", None, PROFILER_MIN if mode == "min" else [])
                     for k in (1, 2) for mode in ("min", "on")],
    "overhead-small": [("0.5b-small-profiler-min", "qwen2.5-0.5b", OVH_SMALL + PROFILER_MIN),
                       ("0.5b-small-profiler-on", "qwen2.5-0.5b", OVH_SMALL)],
    # controllers on 2 GPUs, same probe (0.5B, HF rollout unless named)
    "controllers": [
        ("spmd-2gpu", "qwen2.5-0.5b", GPU_BASE + [f"system.device_map={ALL2}"]),
        ("single-colocated", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={ALL2}"]),
        ("single-split", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={SPLIT}"]),
        ("single-split-vllm", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={SPLIT}",
                                                          "system.rollout.backend=vllm", "system.weight_sync=collective"]),
        ("single-split-collective", "qwen2.5-0.5b", GPU_BASE + ["system.controller=single", f"system.device_map={SPLIT}",
                                                                "system.weight_sync=collective"]),
    ],
    # projection fidelity: what a 100-step probe projects for 500 steps vs a 500-step run, 3 configurations
    "fidelity": [row for name, extra in FID_CONFIGS.items()
                 for row in ((f"{name}-probe100", "qwen2.5-0.5b", FID + extra + ["probe.steps=100"]),
                             (f"{name}-run500", "qwen2.5-0.5b", FID + extra + FULL_RUN))],
    # the same comparison on the CPU default (embedded model, 1 rank, 32 samples a step): a 500-step run is cheap
    "fidelity-cpu": [row for name, extra in {"a-ppo": [], "b-ppo-ckpt-micro8": ["system.memory.gradient_checkpointing=true",
                                                                               "system.batch.micro_batch_size=8"],
                                             "c-grpo": ["algorithm.name=grpo", "system.batch.samples_per_prompt=2",
                                                        "system.batch.prompts_per_step=16"]}.items()
                     for row in ((f"{name}-probe100", None, ["run.samples=16000", "probe.steps=100"] + extra),
                                 (f"{name}-run500", None, ["run.samples=16000"] + extra + FULL_RUN))],
    # cost growth: step time and peak memory as the work doubles
    "growth": [(f"prompts{n}", "qwen2.5-0.5b", GROW + [f"system.batch.prompts_per_step={n}", "task.max_new_tokens=128"])
               for n in (16, 32, 64, 128)]
              + [(f"tokens{n}", "qwen2.5-0.5b", GROW + ["system.batch.prompts_per_step=64", f"task.max_new_tokens={n}"])
                 for n in (32, 64, 128, 256)],
    # the embedded default learns, 3 seeds, PPO and GRPO (CPU, 100 steps each)
    "learning": [
        ("ppo-seed0", None, ["probe.seed=0"]),
        ("ppo-seed1", None, ["probe.seed=1"]),
        ("ppo-seed2", None, ["probe.seed=2"]),
        ("grpo-seed0", "tiny-grpo", ["probe.seed=0"]),
        ("grpo-seed1", "tiny-grpo", ["probe.seed=1"]),
        ("grpo-seed2", "tiny-grpo", ["probe.seed=2"]),
        # the KL to the reference as GRPO's loss term (k3, its default), and PPO's KL in the reward
        ("grpo-kl-seed0", "tiny-grpo", ["probe.seed=0", "algorithm.kl_coef=0.05"]),
        ("ppo-kl-seed0", None, ["probe.seed=0", "algorithm.kl_coef=0.05"]),
    ],
    # CPU smoke of the same harness
    "cpu": [
        ("spmd-1", None, ["probe.steps=4", "system.batch.prompts_per_step=8"]),
        ("spmd-2", None, ["probe.steps=4", "system.batch.prompts_per_step=8", f"system.device_map={ALL2}"]),
    ],
}

COLUMNS = ["status", "steps", "wall_s", "reward_first10", "reward_last10", "startup_s", "timing_s/step", "timing_s/gen", "timing_s/ref", "timing_s/values",
           "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights", "perf/max_memory_reserved_gb",
           "nvml_peak_gb", "comm_total_s", "comm_exposed_s", "perf/throughput", "perf/mfu/actor", "perf/mfu/critic",
           "cost/probe_yuan", "cost/projected_yuan"]


def row_of(label: str, s: dict) -> dict:
    steady = s.get("steady", {})
    nvml = [v for k, v in s.items() if k.startswith("nvml/mem_used_gb/") and v is not None]
    comm_total = sum(v for k, v in steady.items() if k.startswith("comm/total_s/"))
    comm_exposed = sum(v for k, v in steady.items() if k.startswith("comm/exposed_s/"))
    row = {"label": label, **{k: s.get(k) for k in ("status", "steps", "wall_s", "reward_first10", "reward_last10", "startup_s",
                                                       "perf/throughput", "perf/mfu/actor", "perf/mfu/critic",
                                                       "cost/probe_yuan", "cost/projected_yuan")}}
    row |= {k: steady.get(k) for k in COLUMNS if k.startswith(("timing_s/", "perf/max_memory"))}
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
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override added to every row")
    args = ap.parse_args()
    if args.suite not in ("cpu", "learning", "fidelity-cpu", "overhead-cpu") and not torch.cuda.is_available():
        print(f"suite {args.suite} needs an NVIDIA GPU and none is visible; run it on the GPU machine.", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # a second run into the same directory adds its rows to the first call's
    done = out / f"{args.suite}.json"
    summaries = json.loads(done.read_text()) if done.exists() else {}
    rows = [row_of(label, s) for label, s in summaries.items()]
    for label, recipe, overrides in SUITES[args.suite]:
        if args.only and label not in args.only:
            continue
        if "single" in label and torch.cuda.device_count() < 2 and "[1]" in " ".join(overrides):
            continue
        result = run_probe(load_recipe(recipe, overrides + args.set), out=out / "runs", run_id=label)
        summaries[label] = result.summary
        rows.append(row_of(label, result.summary))
        print(json.dumps(rows[-1]), flush=True)
        (out / f"{args.suite}.json").write_text(json.dumps(summaries, indent=1, default=str))
        (out / f"{args.suite}.md").write_text(to_markdown(rows))
    print(to_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
