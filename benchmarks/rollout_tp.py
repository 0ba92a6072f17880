"""Rollout tensor parallelism on two GPUs: engine throughput by layout, a 7B probe, a 7B that must not fit.

1. Engine throughput (the product's own rollout engine, ``VLLMRollout`` built by ``build_rollout``; no
   trainer): rollout tokens/s of one TP-1 engine on one GPU, one TP-2 engine over both GPUs, and two
   TP-1 replicas generating half the prompts each at once, on the 0.5B and 1.5B presets (random init,
   embedded tokenizer, ``--prompts`` prompts x 128 new tokens, EOS ignored, eager engine, after a warm-up
   generation). Each layout runs in fresh processes: ``--engine`` is one engine's process.
2. A 20-step probe of recipes/qwen2.5-7b.yaml (GRPO, FSDP2 over both GPUs, the engine TP 2 unless
   ``--probe-tp 1``): phase times, memory per GPU (NVML, every process) and NCCL time, exposed vs total.
3. A 7B configuration too large for the card (PPO, no offload or checkpointing, micro-batch 64, the engine
   at 0.9 of the card): the memory verdict must skip it (``skipped: would not fit``, no GPU time spent);
   with ``--run-too-large`` it is launched anyway and its status must be ``oom``.

Writes ``OUT/tp/rollout_tp.json`` (for benchmarks/collect.py), ``OUT/tp/rollout_tp.md``, the probes' run
directories and the engines' logs under ``OUT/tp``::

    PYTHONPATH=. python3 benchmarks/rollout_tp.py --out "$OUT/tp"
    PYTHONPATH=. python3 benchmarks/rollout_tp.py --dry-run     # the plan and the memory verdicts, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b")
CARD = "h200"
PROBE_RECIPE = "qwen2.5-7b"
PROBE_SETS = ["probe.steps=20", "probe.warmup_steps=3", "profiler.comm_steps=2"]
TOO_LARGE_SETS = ["algorithm.name=ppo", "system.memory.gradient_checkpointing=false",
                  "system.memory.param_offload=false", "system.memory.reshard_after_forward=false",
                  "system.batch.micro_batch_size=64", "system.rollout.gpu_memory_utilization=0.9",
                  "probe.steps=3"]
ENGINE_SETS = ["system.rollout.backend=vllm", "system.controller=single", "system.rollout.enable_sleep=false",
               "system.rollout.gpu_memory_utilization=0.5", "task.max_new_tokens=128", "task.fixed_length=true"]


# ---------------------------------------------------------------- one engine's process


def engine_recipe(ckpt: str, tp: int):
    from tunekit.config import load_recipe

    rollout = list(range(tp))
    return load_recipe(None, ENGINE_SETS + [f"model.path={ckpt}", f"system.rollout.tensor_parallel_size={tp}",
                                            f"system.device_map={{actor:[0],ref:[0],critic:[0],reward:[0],rollout:{rollout}}}"])


def prompt_texts(n: int) -> list[str]:
    return [f"{i % 20}+{(7 * i) % 20}=" for i in range(n)]


def run_engine(args) -> int:
    """Build one engine on this process's GPUs, warm it up, time generations; write what it measured."""
    import torch

    from tunekit.placement.dist import Dist
    from tunekit.trainer.batch import encode_prompts
    from tunekit.trainer.build import build_rollout, load_tokenizer

    recipe = engine_recipe(args.engine, args.tp)
    tok = load_tokenizer(recipe)
    t0 = time.monotonic()
    rollout = build_rollout(recipe, Dist(device=torch.device("cuda", 0)), tok, engine_dir=args.engine)
    out = {"tp": args.tp, "start_s": time.monotonic() - t0}
    rollout.generate(encode_prompts(tok, prompt_texts(16)), seed=0)  # warm-up

    def timed(n: int, seed: int) -> dict:
        prompts = encode_prompts(tok, prompt_texts(n))
        start = time.time()
        ids, _ = rollout.generate(prompts, seed=seed)
        end = time.time()
        tokens = int((ids != rollout.pad_id).sum()) if not recipe.task.fixed_length else ids.numel()
        return {"prompts": n, "tokens": tokens, "start": start, "end": end, "tokens_per_s": tokens / (end - start)}

    out["alone"] = timed(args.prompts, seed=1)
    if args.barrier:  # replicas: each generates its share at the same moment as the others
        barrier = Path(args.barrier)
        (barrier / f"ready-{args.replica}").write_text("1")
        deadline = time.monotonic() + 300
        while len(list(barrier.glob("ready-*"))) < args.replicas and time.monotonic() < deadline:
            time.sleep(0.05)
        out["share"] = timed(args.prompts // args.replicas, seed=2 + args.replica)
    out["kv_usage_peak"] = rollout.last_metrics.get("rollout/kv_usage_peak")
    Path(args.result).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------- the layouts


def export_preset(preset: str, out: Path) -> Path:
    """The preset's random initial weights (bf16) and the embedded tokenizer, once per preset."""
    import torch

    from tunekit.config import load_recipe
    from tunekit.trainer.build import build_policy, load_tokenizer
    from tunekit.trainer.rollout.checkpoint import export_checkpoint

    ckpt = out / "ckpt" / preset
    if (ckpt / "config.json").exists():
        return ckpt
    recipe = load_recipe(None, [f"model.preset={preset}"])
    tok = load_tokenizer(recipe)
    model = build_policy(recipe, tok, device="cuda")
    export_checkpoint(model, tok, path=None, out_dir=ckpt)
    del model
    torch.cuda.empty_cache()
    return ckpt


def spawn(ckpt: Path, tp: int, gpus: str, result: Path, log: Path, prompts: int, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, __file__, "--engine", str(ckpt), "--tp", str(tp), "--prompts", str(prompts),
           "--result", str(result), *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(None)
    return codes


def bench_preset(preset: str, out: Path, prompts: int, timeout: float) -> dict:
    """TP 1 alone and two TP-1 replicas (one pair of processes), then TP 2 over both GPUs."""
    ckpt = export_preset(preset, out)
    work = out / "engines" / preset
    work.mkdir(parents=True, exist_ok=True)
    barrier = work / "barrier"
    barrier.mkdir(exist_ok=True)
    row: dict = {"preset": preset, "prompts": prompts, "new_tokens": 128}
    t0 = time.monotonic()
    pair = [spawn(ckpt, 1, str(i), work / f"tp1-gpu{i}.json", work / f"tp1-gpu{i}.log", prompts,
                  ["--barrier", str(barrier), "--replica", str(i), "--replicas", "2"]) for i in (0, 1)]
    codes = wait_all(pair, timeout / 2)
    results = [json.loads((work / f"tp1-gpu{i}.json").read_text()) if code == 0 else None for i, code in enumerate(codes)]
    if all(results):
        row["tp1_one_gpu_tokens_per_s"] = sum(r["alone"]["tokens_per_s"] for r in results) / 2
        shares = [r["share"] for r in results]
        span = max(s["end"] for s in shares) - min(s["start"] for s in shares)
        row["tp1_x2_replicas_tokens_per_s"] = sum(s["tokens"] for s in shares) / span
        row["tp1_start_s"] = max(r["start_s"] for r in results)
    else:
        row["tp1_error"] = f"exit codes {codes}; see {work}/tp1-gpu*.log"
    proc = spawn(ckpt, 2, "0,1", work / "tp2.json", work / "tp2.log", prompts, [])
    code = wait_all([proc], max(60.0, timeout - (time.monotonic() - t0)))[0]
    if code == 0:
        tp2 = json.loads((work / "tp2.json").read_text())
        row["tp2_tokens_per_s"] = tp2["alone"]["tokens_per_s"]
        row["tp2_start_s"] = tp2["start_s"]
    else:
        row["tp2_error"] = f"exit code {code}; see {work}/tp2.log"
    row["wall_s"] = time.monotonic() - t0
    return row


# ---------------------------------------------------------------- the 7B probes


def probe_recipe(sets: list[str]):
    from tunekit.config import load_recipe

    return load_recipe(PROBE_RECIPE, sets)


def probe_row(result, warmup: int) -> dict:
    """The probe's table: phase medians, memory per GPU, NCCL total vs exposed per phase (sampled steps)."""
    from tunekit.rundir import read_steps

    s = result.summary
    steps = read_steps(result.run_dir)
    steady = steps.iloc[min(warmup, max(0, len(steps) - 1)):]  # medians over the steps after warm-up, even of a cut run
    med = {c: float(steady[c].median()) for c in steady.columns if steady[c].notna().any()}
    row = {"status": s["status"], "reason": s.get("reason", ""), "steps": len(steps), "wall_s": s.get("wall_s"),
           "startup_s": s.get("startup_s"), "run_dir": str(result.run_dir),
           "phases_s": {k.removeprefix("timing_s/"): v for k, v in sorted(med.items()) if k.startswith("timing_s/")},
           "rollout_tokens_per_s": med.get("rollout/tokens_per_s"),
           "throughput_tokens_per_s_per_gpu": s.get("perf/throughput"),
           "nvml_mem_used_gb": {k.rsplit("/", 1)[1]: v for k, v in s.items() if k.startswith("nvml/mem_used_gb/")},
           "max_memory_reserved_gb": med.get("perf/max_memory_reserved_gb"),
           "memory_estimate_gb": s.get("memory/estimate_gb"), "card_gb": s.get("memory/card_gb")}
    comm = {}
    for col in steps.columns:
        if col.startswith(("comm/total_s/", "comm/exposed_s/")):
            vals = steps[col].dropna()
            if len(vals):
                kind, phase = col.split("/")[1], col.split("/")[2]
                comm.setdefault(phase, {})[kind.removesuffix("_s")] = float(vals.mean())
    row["nccl_s_per_step"] = comm
    return row


def probe_table(row: dict) -> str:
    lines = [f"7B probe: {row['status']} {row.get('reason', '')[:300]}",
             f"  steps {row.get('steps')}, wall {fmt(row.get('wall_s'))} s, startup {fmt(row.get('startup_s'))} s, "
             f"rollout {fmt(row.get('rollout_tokens_per_s'), '.0f')} tok/s per GPU",
             "  phase (median s):  " + "  ".join(f"{k} {fmt(v)}" for k, v in row.get("phases_s", {}).items()),
             "  memory per GPU (NVML GiB): " + "  ".join(f"GPU {g} {fmt(v)}" for g, v in row.get("nvml_mem_used_gb", {}).items())
             + f"  (estimate {fmt(row.get('memory_estimate_gb'))} of {fmt(row.get('card_gb'))})",
             "  NCCL per step (s, sampled steps): " + "  ".join(
                 f"{p} total {fmt(c.get('total'))} exposed {fmt(c.get('exposed'))}" for p, c in row.get("nccl_s_per_step", {}).items())]
    return "\n".join(lines)


def too_large(out: Path, run_it: bool, timeout: float) -> dict:
    from tunekit.estimate.memory import would_not_fit
    from tunekit.estimate.profiles import load_profile
    from tunekit.runners import runner_for

    recipe = probe_recipe(TOO_LARGE_SETS + [f"probe.timeout_s={timeout:.0f}"])
    why = would_not_fit(recipe, load_profile(CARD).memory_gib, traits=runner_for(recipe).traits)
    row = {"sets": TOO_LARGE_SETS, "verdict": f"skipped: {why}" if why else "fits by the estimate"}
    if run_it:
        from tunekit.launch.probe import run_probe

        result = run_probe(recipe, out=out / "runs", run_id="too-large")
        row |= {"status": result.summary["status"], "reason": result.summary.get("reason", "")[:300]}
    return row


def fmt(v, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def markdown(summary: dict) -> str:
    meta = summary["meta"]
    lines = [f"# Rollout tensor parallelism ({meta.get('gpu', '?')} x{meta.get('gpus', '?')}, {meta['date']})", "",
             f"Command: `{meta['command']}`", "",
             "| preset | TP 1, one GPU tok/s | TP 2 tok/s | 2 x TP 1 replicas tok/s | TP 2 / 2 replicas |",
             "|---|---|---|---|---|"]
    for r in summary.get("engines", []):
        tp2, reps = r.get("tp2_tokens_per_s"), r.get("tp1_x2_replicas_tokens_per_s")
        ratio = f"{tp2 / reps:.2f}" if tp2 and reps else "-"
        lines.append(f"| {r['preset']} | {fmt(r.get('tp1_one_gpu_tokens_per_s'), '.0f')} | {fmt(tp2, '.0f')} | "
                     f"{fmt(reps, '.0f')} | {ratio} |")
    if "probe_7b" in summary:
        lines += ["", "```", probe_table(summary["probe_7b"]), "```"]
    if "too_large_7b" in summary:
        t = summary["too_large_7b"]
        lines += ["", f"Too-large 7B ({' '.join(t['sets'])}): {t['verdict']}"
                  + (f"; launched: {t['status']} {t.get('reason', '')[:200]}" if "status" in t else "")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def dry_run(args) -> int:
    from tunekit.estimate.memory import estimate_memory, model_shape
    from tunekit.estimate.profiles import load_profile
    from tunekit.runners import runner_for

    card = load_profile(CARD).memory_gib
    for preset in PRESETS:
        for tp in (1, 2):
            r = engine_recipe(f"/ckpt/{preset}", tp)
            print(f"engine {preset} TP {tp}: replicas {r.system.rollout_replicas}, {args.prompts} prompts x 128 tokens")
    for name, sets in (("7B probe", [f"system.rollout.tensor_parallel_size={args.probe_tp}", *PROBE_SETS]),
                       ("too-large 7B", TOO_LARGE_SETS)):
        r = probe_recipe(sets)
        est = estimate_memory(r, model_shape(r), card, traits=runner_for(r).traits)
        print(f"{name}: {r.algorithm.name}, device map {r.system.device_map['actor']}, rollout replicas "
              f"{r.system.rollout_replicas}, estimate {est.peak / 2**30:.1f} of {card:g} GiB: {est.verdict}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")) / "tp")
    ap.add_argument("--prompts", type=int, default=512, help="prompts per engine generation")
    ap.add_argument("--probe-tp", type=int, default=2, choices=(1, 2), help="the 7B probe's engine: TP 2 or two TP-1 replicas")
    ap.add_argument("--probe-timeout", type=float, default=300.0, help="seconds the 7B probe may take")
    ap.add_argument("--budget", type=float, default=470.0, help="seconds for everything (what is left is skipped)")
    ap.add_argument("--only", nargs="*", choices=("probe", "engines", "too-large"), help="run only these parts")
    ap.add_argument("--run-too-large", action="store_true", help="launch the too-large 7B anyway (expect status oom)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the memory verdicts; no GPU")
    # one engine's process (internal)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--barrier", help=argparse.SUPPRESS)
    ap.add_argument("--replica", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        return run_engine(args)
    if args.dry_run:
        return dry_run(args)

    import torch

    if torch.cuda.device_count() < 2:
        print("rollout_tp: needs 2 NVIDIA GPUs and vLLM; run it on the 2-GPU H200 machine.", file=sys.stderr)
        return 2
    import vllm

    from tunekit.launch.probe import run_probe

    parts = set(args.only or ("probe", "engines", "too-large"))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    summary: dict = {"meta": {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "vllm": vllm.__version__,
                              "command": "PYTHONPATH=. python3 benchmarks/rollout_tp.py --out $OUT/tp"
                                         + (f" --probe-tp {args.probe_tp}" if args.probe_tp != 2 else "")}}

    def save() -> None:
        summary["meta"]["total_s"] = time.monotonic() - t0
        (out / "rollout_tp.json").write_text(json.dumps(summary, indent=1, default=str))
        (out / "rollout_tp.md").write_text(markdown(summary))

    def left() -> float:
        return args.budget - (time.monotonic() - t0)

    if "too-large" in parts:  # the estimate first: no GPU time unless --run-too-large
        summary["too_large_7b"] = too_large(out, args.run_too_large, timeout=min(120.0, max(30.0, left() - 30)))
        print(f"[{time.monotonic() - t0:5.0f}s] too-large 7B: {summary['too_large_7b']}", flush=True)
        save()
    if "engines" in parts:
        summary["engines"] = []
        for preset in PRESETS:
            if left() < 60:
                summary["engines"].append({"preset": preset, "skipped": f"budget of {args.budget:g} s spent"})
                continue
            print(f"[{time.monotonic() - t0:5.0f}s] engines {preset}", flush=True)
            summary["engines"].append(bench_preset(preset, out, args.prompts, timeout=min(200.0, left() - 10)))
            print(json.dumps(summary["engines"][-1]), flush=True)
            save()
    if "probe" in parts:
        timeout = min(args.probe_timeout, left() - 20)
        recipe = probe_recipe([f"system.rollout.tensor_parallel_size={args.probe_tp}", *PROBE_SETS,
                               f"probe.timeout_s={timeout:.0f}"])
        print(f"[{time.monotonic() - t0:5.0f}s] 7B probe (TP {args.probe_tp}), at most {timeout:.0f} s", flush=True)
        result = run_probe(recipe, out=out / "runs", run_id=f"qwen2.5-7b-tp{args.probe_tp}-{time.strftime('%H%M%S')}")
        summary["probe_7b"] = probe_row(result, recipe.probe.warmup_steps) | {"tensor_parallel_size": args.probe_tp}
        print(probe_table(summary["probe_7b"]), flush=True)
        save()
    save()
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
