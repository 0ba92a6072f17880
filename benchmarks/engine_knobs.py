"""vLLM engine knobs on one GPU: generation time vs gpu_memory_utilization, max_num_seqs and prefix caching, and the
memory estimate vs the measured peak over the same probes.

GRPO 64 prompts x 4 samples x 128 new tokens (fixed length), in-process engine sleeping while training runs, on a
Qwen2.5 preset (random init, embedded tokenizer). A baseline (utilization 0.5, max_num_seqs 256, prefix caching on)
and one change at a time: utilization 0.3 and 0.7, max_num_seqs 64, prefix caching off. Each probe runs through
``tunekit.launch.probe.run_probe`` in its own process tree, one after the other. Writes
``OUT/engine_knobs_<preset>.json``, ``OUT/engine_knobs_<preset>.md`` and the run dirs under ``OUT/runs``.

    pip install -e ".[vllm]" && python3 benchmarks/engine_knobs.py --preset qwen2.5-0.5b --out "$OUT"

The memory columns set the estimate (``memory/estimate_gb``, the fullest GPU) against NVML's peak on that GPU
(every process, the engine's pool included) and against torch's allocator peak (``perf/max_memory_reserved_gb``,
which may not count a sleep-mode engine's pool); error = (estimate - measured) / measured.
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
          "algorithm.name=grpo", "system.batch.prompts_per_step=64", "system.batch.samples_per_prompt=4",
          "task.max_new_tokens=128", "task.fixed_length=true", "system.rollout.backend=vllm",
          "system.rollout.enable_sleep=true"]
BASE = {"system.rollout.gpu_memory_utilization": 0.5, "system.rollout.max_num_seqs": 256,
        "system.rollout.enable_prefix_caching": True}
VARIANTS = {"base": {}, "util_0.3": {"system.rollout.gpu_memory_utilization": 0.3},
            "util_0.7": {"system.rollout.gpu_memory_utilization": 0.7}, "seqs_64": {"system.rollout.max_num_seqs": 64},
            "prefix_off": {"system.rollout.enable_prefix_caching": False}}


def overrides(name: str) -> list[str]:
    knobs = BASE | VARIANTS[name]
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]


def _median(col) -> float | None:
    vals = [float(v) for v in col if v == v]
    return statistics.median(vals) if vals else None


def error(estimate: float | None, measured: float | None) -> float | None:
    """(estimate - measured) / measured; None when either is missing."""
    if estimate is None or not measured:
        return None
    return (estimate - measured) / measured


def measure(result, warmup: int) -> dict:
    from tunekit.rundir import read_steps

    s, steps = result.summary, read_steps(result.run_dir)
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps
    row = {"status": s["status"], "reason": s.get("reason", ""), "steps": len(steps), "startup_s": s.get("startup_s")}
    for key in ("timing_s/gen", "timing_s/step", "rollout/tokens_per_s", "rollout/kv_usage_peak"):
        row[key] = _median(steady[key]) if key in steady else None
    row["rollout/preemptions"] = float(steady["rollout/preemptions"].sum()) if "rollout/preemptions" in steady else None
    row["perf/max_memory_reserved_gb"] = float(steps["perf/max_memory_reserved_gb"].max()) if "perf/max_memory_reserved_gb" in steps else None
    nvml = [float(v) for k, v in s.items() if k.startswith("nvml/mem_used_gb/") and isinstance(v, (int, float))]
    row["nvml_peak_gb"] = max(nvml) if nvml else None
    row["memory/estimate_gb"] = s.get("memory/estimate_gb")
    row["error_vs_nvml"] = error(row["memory/estimate_gb"], row["nvml_peak_gb"])
    row["error_vs_reserved"] = error(row["memory/estimate_gb"], row["perf/max_memory_reserved_gb"])
    return row


def fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def error_summary(rows: dict[str, dict], key: str) -> str:
    errs = [r[key] for r in rows.values() if r.get(key) is not None]
    if not errs:
        return "-"
    worst = max(errs, key=abs)
    return f"median {statistics.median(errs):+.1%}, worst {worst:+.1%} over {len(errs)} probes"


def markdown(rows: dict[str, dict], meta: dict) -> str:
    head = ("| config | status | gen s | vs base | step s | KV usage peak | preemptions | estimate GiB | NVML peak GiB | "
            "error vs NVML | reserved peak GiB | error vs reserved |")
    base_gen = (rows.get("base") or {}).get("timing_s/gen")
    lines = [f"# vLLM engine knobs, {meta['preset']} ({meta['gpu']}, {meta['date']})", "", f"Command: `{meta['command']}`",
             "", f"Probe: {meta['probe']}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows.items():
        gen = r.get("timing_s/gen")
        ratio = f"{gen / base_gen:.2f}x" if gen and base_gen else "-"
        lines.append(" | ".join([
            f"| {name} ({' '.join(r['overrides'])})", r["status"], fmt(gen), ratio, fmt(r.get("timing_s/step")),
            fmt(r.get("rollout/kv_usage_peak")), fmt(r.get("rollout/preemptions"), ".0f"), fmt(r.get("memory/estimate_gb")),
            fmt(r.get("nvml_peak_gb")), fmt(r.get("error_vs_nvml"), "+.1%"), fmt(r.get("perf/max_memory_reserved_gb")),
            fmt(r.get("error_vs_reserved"), "+.1%")]) + " |")
    notes = [f"- {name}: {r['reason'][:300]}" for name, r in rows.items() if r.get("reason")]
    lines += ["", "Medians over the steady steps (the first step is warm-up); preemptions summed over them.",
              f"Estimate vs NVML peak: {error_summary(rows, 'error_vs_nvml')}.",
              f"Estimate vs allocator peak: {error_summary(rows, 'error_vs_reserved')}."]
    return "\n".join(lines + (["", "Failures:"] + notes if notes else [])) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    ap.add_argument("--steps", type=int, default=5, help="steps per probe (the first is warm-up)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per probe at most")
    ap.add_argument("--budget", type=float, default=560.0, help="seconds for all probes (no probe starts once spent)")
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), help="run only these configs")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        print("engine_knobs: needs an NVIDIA GPU and vLLM (`pip install -e '.[vllm]'`); run it on the H200 machine.",
              file=sys.stderr)
        return 2
    import vllm

    from tunekit.config import load_recipe
    from tunekit.launch.probe import run_probe

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"preset": args.preset, "gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__, "vllm": vllm.__version__,
            "command": f"PYTHONPATH=. python3 benchmarks/engine_knobs.py --preset {args.preset} --out $OUT",
            "probe": f"recipe {args.preset} + {' '.join(c.format(steps=args.steps, timeout='T') for c in COMMON)}"}
    rows: dict[str, dict] = {}
    t0 = time.monotonic()
    for name in [n for n in VARIANTS if not args.only or n in args.only]:
        left = args.budget - (time.monotonic() - t0)
        if left < 60:
            rows[name] = {"status": "skipped", "reason": f"benchmark budget ({args.budget:g} s) spent", "overrides": overrides(name)}
            continue
        common = [c.format(steps=args.steps, timeout=min(args.timeout, left - 15)) for c in COMMON]
        recipe = load_recipe(args.preset, common + overrides(name))
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {' '.join(overrides(name))}", flush=True)
        result = run_probe(recipe, out=args.out / "runs", run_id=f"{args.preset}-{name}-{time.strftime('%H%M%S')}")
        rows[name] = measure(result, warmup=1) | {"overrides": overrides(name), "run_dir": str(result.run_dir)}
        r = rows[name]
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {r['status']} gen={fmt(r['timing_s/gen'])}s "
              f"kv={fmt(r['rollout/kv_usage_peak'])} est={fmt(r['memory/estimate_gb'])} nvml={fmt(r['nvml_peak_gb'])} "
              f"{r['reason'][:200]}", flush=True)
        meta["total_s"] = time.monotonic() - t0  # written after every probe: a run cut short keeps what it measured
        stem = f"engine_knobs_{args.preset}"
        (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
        (args.out / f"{stem}.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0 if all(r["status"] == "ok" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
