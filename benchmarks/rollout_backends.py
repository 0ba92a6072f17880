"""Rollout backends on one probe shape: hf vs vllm (sleep on/off) vs vllm_server, on the H200.

Same probe for each (Qwen2.5-0.5B preset, random init, embedded tokenizer; 256 prompts x 128
new tokens, fixed length; PPO; a few steps, the first one warm-up), each run by
``tunekit.launch.probe.run_probe`` in its own process tree, one after the other. Writes
``OUT/rollout_backends.json``, ``OUT/rollout_backends.md`` and the run dirs under ``OUT/runs``.

    pip install -e ".[vllm]" && python3 benchmarks/rollout_backends.py --out "$OUT"

With 2 GPUs the server gets GPU 1 of its own (weights pushed over NCCL); with 1 GPU it
shares GPU 0 with the trainer, and since NCCL puts no two ranks on one GPU its weights
go stale (``rollout/staleness_steps`` says by how much).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

COMMON = ["probe.steps={steps}", "probe.warmup_steps=1", "probe.timeout_s={timeout}", "profiler.comm_steps=0",
          "system.batch.prompts_per_step=256", "system.batch.samples_per_prompt=1", "system.batch.micro_batch_size=32",
          "task.max_new_tokens=128", "task.fixed_length=true", "system.rollout.gpu_memory_utilization=0.35"]
SPLIT_MAP = "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1]}"


def configs(n_gpus: int) -> dict[str, list[str]]:
    server = ["system.rollout.backend=vllm_server"] + ([SPLIT_MAP] if n_gpus >= 2 else [])
    return {
        "hf": ["system.rollout.backend=hf"],
        "vllm_sleep": ["system.rollout.backend=vllm", "system.rollout.enable_sleep=true"],
        "vllm_nosleep": ["system.rollout.backend=vllm", "system.rollout.enable_sleep=false"],
        # CUDA graphs of the decode steps (no torch.compile): a small model's decode is launch-bound
        "vllm_graphs": ["system.rollout.backend=vllm", "system.rollout.enable_sleep=true",
                        "system.rollout.enforce_eager=false"],
        "vllm_server_gpu1" if n_gpus >= 2 else "vllm_server_shared_gpu0": server,
    }


def _median(col) -> float | None:
    vals = [float(v) for v in col if v == v]
    return statistics.median(vals) if vals else None


def measure(result, warmup: int) -> dict:
    """One row of the table from a finished probe (steady steps only, except the on-policy columns)."""
    from tunekit.rundir import read_steps

    s, steps = result.summary, read_steps(result.run_dir)
    row = {"status": s["status"], "reason": s.get("reason", ""), "startup_s": s.get("startup_s"), "wall_s": s.get("wall_s"),
           "steps": len(steps)}
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps
    for key in ("rollout/tokens_per_s", "timing_s/gen", "timing_s/update_weights", "timing_s/step",
                "rollout/weight_sync_bytes"):
        row[key] = _median(steady[key]) if key in steady else None
    for key in ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"):
        row[key] = float(steps[key].max()) if key in steps else None
    row["nvml/mem_used_gb"] = {k.rsplit("/", 1)[1]: v for k, v in s.items() if k.startswith("nvml/mem_used_gb/")}
    row["rollout/logprob_abs_diff_mean"] = float(steps["rollout/logprob_abs_diff_mean"].mean()) if len(steps) else None
    row["rollout/logprob_abs_diff_max"] = float(steps["rollout/logprob_abs_diff_mean"].max()) if len(steps) else None
    row["rollout/staleness_steps_max"] = (float(steps["rollout/staleness_steps"].max())
                                          if "rollout/staleness_steps" in steps else 0.0)
    if row["timing_s/update_weights"] is not None and row["timing_s/step"]:
        row["update_weights_share_of_step"] = row["timing_s/update_weights"] / row["timing_s/step"]
    return row


def fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return " / ".join(f"{k}: {x:.1f}" for k, x in sorted(v.items())) or "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def markdown(rows: dict[str, dict], meta: dict) -> str:
    hf_tps = (rows.get("hf") or {}).get("rollout/tokens_per_s")
    head = ("| config | status | rollout tok/s | vs hf | gen s | update_weights s | sync % step | step s | "
            "alloc peak GiB | reserved peak GiB | NVML peak GiB (gpu) | logprob abs diff mean (max) | staleness max |")
    lines = [f"# Rollout backends ({meta['gpu']}, {meta['date']})", "", f"Command: `{meta['command']}`", "",
             f"Probe: {meta['probe']}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows.items():
        tps = r.get("rollout/tokens_per_s")
        ratio = f"{tps / hf_tps:.2f}x" if tps and hf_tps else "-"
        share = r.get("update_weights_share_of_step")
        lines.append(" | ".join([
            f"| {name}", r["status"], fmt(tps, ".0f"), ratio, fmt(r.get("timing_s/gen")), fmt(r.get("timing_s/update_weights")),
            f"{100 * share:.1f}%" if share is not None else "-", fmt(r.get("timing_s/step")),
            fmt(r.get("perf/max_memory_allocated_gb")), fmt(r.get("perf/max_memory_reserved_gb")), fmt(r.get("nvml/mem_used_gb")),
            f"{fmt(r.get('rollout/logprob_abs_diff_mean'))} ({fmt(r.get('rollout/logprob_abs_diff_max'))})",
            fmt(r.get("rollout/staleness_steps_max"), ".0f")]) + " |")
    notes = [f"- {name}: {r['reason'][:300]}" for name, r in rows.items() if r.get("reason")]
    lines += ["", "Medians over the steady steps (the first step is warm-up); peaks and the logprob diff over all steps. "
              "Allocator peaks are torch's; a sleep-mode engine allocates through vLLM's own pool, which they may not count; NVML sees all.",
              "Goals: vllm >= 4x hf rollout tokens/s; update_weights < 5% of the step."]
    return "\n".join(lines + (["", "Failures:"] + notes if notes else [])) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    ap.add_argument("--steps", type=int, default=4, help="steps per probe (the first is warm-up)")
    ap.add_argument("--timeout", type=float, default=170.0, help="seconds per probe at most")
    ap.add_argument("--budget", type=float, default=460.0, help="seconds for all probes (the probes stop starting once it is spent)")
    ap.add_argument("--only", nargs="*", help="run only these configs")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("rollout_backends: needs an NVIDIA GPU (vLLM does not run on CPU); run it on the H200 machine.", file=sys.stderr)
        return 2
    if importlib.util.find_spec("vllm") is None:
        print("rollout_backends: needs vLLM; install it with `pip install -e '.[vllm]'`.",
              file=sys.stderr)
        return 2
    from tunekit.config import load_recipe
    from tunekit.launch.probe import run_probe

    import vllm

    n_gpus = torch.cuda.device_count()
    chosen = {k: v for k, v in configs(n_gpus).items() if not args.only or k in args.only}
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(0), "gpus": n_gpus, "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__, "vllm": vllm.__version__,
            "command": "PYTHONPATH=. python3 benchmarks/rollout_backends.py --out $OUT"
                       + (f" --steps {args.steps}" if args.steps != 4 else ""),
            "probe": f"recipe qwen2.5-0.5b + {' '.join(c.format(steps=args.steps, timeout='T') for c in COMMON)}"}
    rows: dict[str, dict] = {}
    t0 = time.monotonic()
    for name, overrides in chosen.items():
        left = args.budget - (time.monotonic() - t0)
        if left < 60:
            rows[name] = {"status": "skipped", "reason": f"benchmark budget ({args.budget:g} s) spent", "overrides": overrides}
            continue
        common = [c.format(steps=args.steps, timeout=min(args.timeout, left - 15)) for c in COMMON]
        recipe = load_recipe("qwen2.5-0.5b", common + overrides)
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {' '.join(overrides)}", flush=True)
        run_id = name if not (args.out / "runs" / name).exists() else f"{name}-{time.strftime('%H%M%S')}"
        result = run_probe(recipe, out=args.out / "runs", run_id=run_id)
        rows[name] = measure(result, warmup=1) | {"overrides": overrides, "run_dir": str(result.run_dir)}
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {rows[name]['status']} "
              f"tok/s={fmt(rows[name]['rollout/tokens_per_s'], '.0f')} gen={fmt(rows[name]['timing_s/gen'])}s "
              f"{rows[name]['reason'][:200]}", flush=True)
        # written after every probe, so a run cut short still leaves what it measured
        meta["total_s"] = time.monotonic() - t0
        (args.out / "rollout_backends.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
        (args.out / "rollout_backends.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0 if all(r["status"] == "ok" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
