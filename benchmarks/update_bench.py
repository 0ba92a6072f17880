"""MFU of the actor and critic update phases at a preset's shape, and what limits it.

Runs tunekit's own ``Actor.update`` / ``Critic.update`` (FSDP2, bf16 mixed precision, the PPO losses) on
one GPU on a synthetic rollout batch (random token ids, every response token kept, random advantages), so
the update phase is timed alone: no generation, no other phases. Each variant builds its model afresh,
runs one warm-up update and then ``--reps`` timed ones (median). The baseline is also run once under
torch.profiler to split its GPU time by kernel kind and to say how busy the GPU was.

    PYTHONPATH=. python3 benchmarks/update_bench.py --preset qwen2.5-1.5b --out "$OUT/update"
    PYTHONPATH=. python3 benchmarks/update_bench.py --preset qwen2.5-0.5b --rows 256 --response 128 \
        --only "actor micro 16" "actor micro 16, no FSDP (autocast bf16)" --profile "actor micro 16"  # TRL's shape

``--probe-shape`` times the actor's update as a probe runs it instead: the actor built from the preset's recipe
(GRPO, 64 prompts x 4 samples x 128 tokens by default; ``system.*`` knobs resolved as a probe on this GPU resolves
them), on the batch a probe's step trains on (the task's own prompts, left-padded, a new step's prompts every
update, so shapes vary as they do in a probe), after ``probe.warmup_steps`` warm-up updates; MFU by the formula a
probe's summary uses for ``perf/mfu/actor`` (:func:`tunekit.launch.probe.perf_metrics`). Each ``--probe-variant``
adds a row with its overrides (the default: the knobs before ``auto``, FSDP2 uncompiled):

    PYTHONPATH=. python3 benchmarks/update_bench.py --probe-shape --preset qwen2.5-1.5b --out "$OUT/update"

The "no FSDP" variants run the trainer's ``system.memory.fsdp_single_gpu: false`` path; the results of
2026-11-29 measured them with an equivalent wrapper in this script (the fp32 module's forward under bf16 autocast).

Writes OUT/update_bench-PRESET.{json,md} (``--probe-shape``: OUT/update_probe-PRESET.{json,md}). MFU = (6 N + 12 L H S) FLOPs per token (the LM head on the response
positions only, as the trainer computes it) over the GPU profile's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

# name: (role, micro-batch, memory overrides, trainer switches)
VARIANTS = {
    "actor micro 32": ("actor", 32, {}, {}),
    "actor micro 32, logits on every position": ("actor", 32, {}, {"keep": False}),
    "actor micro 32, foreach AdamW": ("actor", 32, {}, {"fused": False}),
    "actor micro 32, no FSDP (autocast bf16)": ("actor", 32, {"fsdp_single_gpu": False, "master_weights": False}, {}),
    "actor micro 64": ("actor", 64, {}, {}),
    "actor micro 64, no reshard after forward": ("actor", 64, {"reshard_after_forward": False}, {}),
    "actor micro 16": ("actor", 16, {}, {}),
    "actor micro 16, no FSDP (autocast bf16)": ("actor", 16, {"fsdp_single_gpu": False, "master_weights": False}, {}),
    "actor micro 16, no FSDP, compiled": ("actor", 16, {"fsdp_single_gpu": False, "master_weights": False}, {"compile": True}),
    "actor micro 16, no FSDP, compiled, C++ wrapper": ("actor", 16, {"fsdp_single_gpu": False, "master_weights": False},
                                                       {"compile": True, "cpp_wrapper": True}),
    "actor micro 64, no FSDP, compiled": ("actor", 64, {"fsdp_single_gpu": False, "master_weights": False}, {"compile": True}),
    "actor micro 16, no FSDP, compiled, master weights": ("actor", 16, {"fsdp_single_gpu": False}, {"compile": True}),
    "actor micro 64, checkpointing": ("actor", 64, {"gradient_checkpointing": True}, {}),
    "critic micro 32": ("critic", 32, {}, {}),
    "critic micro 64": ("critic", 64, {}, {}),
    "actor micro 16, compiled": ("actor", 16, {}, {"compile": True}),
    "actor micro 32, compiled": ("actor", 32, {}, {"compile": True}),
    "actor micro 64, compiled": ("actor", 64, {}, {"compile": True}),
    "critic micro 64, compiled": ("critic", 64, {}, {"compile": True}),
    "critic micro 64, no FSDP, compiled": ("critic", 64, {"fsdp_single_gpu": False, "master_weights": False}, {"compile": True}),
}
KINDS = [("nccl", r"nccl"), ("gemm", r"gemm|gemv|cutlass|sm90_xmma|nvjet|matmul|Kernel2"),
         ("attention", r"flash|fmha|attention|efficient"), ("optimizer", r"adam|multi_tensor|foreach"),
         ("softmax / reductions", r"softmax|logsumexp|reduce|norm"), ("elementwise / copies", r".")]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--rows", type=int, default=64, help="samples per update (one mini-batch)")
    ap.add_argument("--prompt", type=int, default=6, help="prompt tokens per row")
    ap.add_argument("--response", type=int, default=256, help="response tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    ap.add_argument("--profile", nargs="*", default=["actor micro 32"], help="variants also run once under torch.profiler")
    ap.add_argument("--cpu-smoke", action="store_true", help="the embedded model on CPU: checks the script, measures nothing")
    ap.add_argument("--probe-shape", action="store_true", help="the actor's update as a probe of the preset's recipe runs it")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="--probe-shape: recipe override")
    ap.add_argument("--probe-variant", action="append", default=None, metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                    help="--probe-shape: one more row with these overrides (default: 'before auto' = FSDP2, eager)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    return ap.parse_args()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def synthetic_batch(rows: int, prompt: int, response: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(prompt + response).expand(rows, -1).clone(),
            "response_mask": torch.ones(rows, response, dtype=torch.long),
            "advantages": torch.randn(rows, response, generator=g), "old_values": torch.zeros(rows, response),
            "returns": torch.randn(rows, response, generator=g)}


def build_role(role: str, preset: str, micro: int, mem: dict, switches: dict, dist):
    from torch._inductor import config as inductor_config

    from tunekit.config import AlgorithmConfig, MemoryConfig
    from tunekit.workload.models import CriticModel, build_causal_lm
    from tunekit.trainer import batch as batch_mod
    from tunekit.trainer.optim import Optimizer
    from tunekit.trainer.roles.actor import Actor
    from tunekit.trainer.roles.critic import Critic

    batch_mod._takes_logits_to_keep = (lambda m: True) if switches.get("keep", True) else (lambda m: False)
    kw = dict(path=None, preset=preset, vocab_size=None, dtype=torch.float32, device=dist.device)
    # a variant without "no FSDP" in its name runs FSDP2 on the one GPU, whatever the default of the knob
    algo, memory = AlgorithmConfig(), MemoryConfig(**({"fsdp_single_gpu": True} | mem))
    compile_ = switches.get("compile", False)  # system.compile: per block under FSDP2, the whole model without
    # Inductor's C++ wrapper launches a compiled graph's kernels from C++ instead of Python (less host time a kernel)
    inductor_config.cpp_wrapper = switches.get("cpp_wrapper", False)
    if role == "actor":
        obj = Actor(build_causal_lm(**kw), algo=algo, mem=memory, dist=dist, micro_batch=micro, temperature=1.0,
                    compile=compile_)
    else:
        obj = Critic(CriticModel.from_actor(build_causal_lm(**kw)), algo=algo, mem=memory, dist=dist, micro_batch=micro, compile=compile_)
    if not switches.get("fused", True):
        obj.optim = Optimizer(torch.optim.AdamW(obj.model.parameters(), lr=algo.actor_lr, weight_decay=0.0, foreach=True))
    return obj


def timed_updates(obj, batch, reps: int) -> list[float]:
    times = []
    for i in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        obj.update(batch, mini_batch=batch["input_ids"].shape[0], seed=i)
        sync()
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first is warm-up (allocator, kernels' first launch)


def kernel_breakdown(obj, batch) -> dict:
    """One profiled update: GPU time per kernel kind, GPU-busy share of the wall time, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from tunekit.profiler.comm import profiled_events
    from tunekit.profiler.traces import _union

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        obj.update(batch, mini_batch=batch["input_ids"].shape[0], seed=99)
        sync()
        wall = time.perf_counter() - t0
    events = profiled_events(prof)
    # host waits for the GPU (a blocking copy, .item(), an explicit sync): each one drains the launch queue
    syncs = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU and "Synchronize" in e.name)
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation
               and not e.name.startswith(("Memcpy", "Memset", "nccl:"))]
    by_kind, by_name = defaultdict(float), defaultdict(float)
    for e in kernels:
        d = (e.time_range.end - e.time_range.start) * 1e-6
        by_name[e.name[:90]] += d
        by_kind[next(k for k, rx in KINDS if re.search(rx, e.name, re.I))] += d
    busy = sum(b - a for a, b in _union((e.time_range.start * 1e-6, e.time_range.end * 1e-6) for e in kernels))
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"profiled_wall_s": wall, "gpu_busy_s": busy, "gpu_busy_share": busy / wall, "kernels": len(kernels), "syncs": syncs,
            "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "top_kernels_s": dict(top)}


def main() -> int:
    args = parse()
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("update_bench needs an NVIDIA GPU and none is visible; run it on the GPU machine.", file=sys.stderr)
        return 2
    if args.probe_shape:
        from probe_update import run as probe_shape  # benchmarks/probe_update.py

        return probe_shape(args)
    from tunekit.workload.models import matmul_shape
    from tunekit.profiler.mfu import update_mfu
    from tunekit.estimate.profiles import match_profile
    from tunekit.placement.dist import init_from_env

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist = init_from_env("cpu" if args.cpu_smoke else "cuda")
    gpu_name = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    profile = None if args.cpu_smoke else match_profile(gpu_name)
    peak = profile.peak_bf16_tflops if profile else None
    if args.cpu_smoke:
        args.preset, args.rows, args.response = None, 8, 8
    shape = matmul_shape(None, args.preset) if args.preset else {"n_params": 1, "n_layers": 1, "hidden": 1, "vocab": 0}
    if args.cpu_smoke:
        from tunekit.workload.models import build_causal_lm
        shape["vocab"] = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32).config.vocab_size
    vocab = shape.pop("vocab")
    head = vocab * shape["hidden"]
    batch = synthetic_batch(args.rows, args.prompt, args.response, vocab)
    tokens, seq = args.rows * (args.prompt + args.response), args.prompt + args.response
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"update_bench-{args.preset or 'cpu'}"  # two presets can share one --out
    results: dict[str, dict] = {"_setup": {"preset": args.preset, "rows": args.rows, "prompt": args.prompt,
                                           "response": args.response, "gpu": gpu_name,
                                           "peak_bf16_tflops": peak, "torch": torch.__version__, **shape}}
    for name, (role, micro, mem, switches) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        gc.collect()
        if not args.cpu_smoke:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        row: dict = {"role": role, "micro": micro, **mem, **switches}
        try:
            obj = build_role(role, args.preset, micro, mem, switches, dist)
            times = timed_updates(obj, batch, args.reps)
            sec = statistics.median(times)
            actor = role == "actor"
            kept = switches.get("keep", True)
            row |= {"update_s": sec, "times_s": times, "tokens_per_s": tokens / sec,
                    "max_reserved_gb": 0.0 if args.cpu_smoke else torch.cuda.max_memory_reserved() / 2**30,
                    "mfu": update_mfu(tokens=tokens, seq_len=seq, epochs=1, seconds=sec, gpus=1, peak_tflops=peak,
                                      head_params=head if actor else 0,
                                      head_tokens=args.rows * (args.response + 1) if actor and kept else None,
                                      **(shape | {"n_params": shape["n_params"] - (0 if actor else head)}))}
            if name in args.profile:
                row["profile"] = kernel_breakdown(obj, batch)
            del obj
        except Exception as e:  # an OOM is a result here, not the end of the benchmark
            row |= {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        results[name] = row
        print(json.dumps({name: {k: v for k, v in row.items() if k != "profile"}}, default=str), flush=True)
        (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / f"{stem}.md").write_text(to_markdown(results))
    print(to_markdown(results))
    return 0


def to_markdown(results: dict) -> str:
    s = results["_setup"]
    lines = [f"{s['preset']}, {s['rows']} rows x ({s['prompt']} prompt + {s['response']} response) tokens, {s['gpu']}, "
             f"peak {s['peak_bf16_tflops']} TFLOP/s, torch {s['torch']}", "",
             "| variant | update s | tokens/s | MFU | reserved peak GiB |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if name.startswith("_"):
            continue
        if "error" in r:
            lines.append(f"| {name} | {r['error']} | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(f"| {name} | {r['update_s']:.3f} | {r['tokens_per_s']:,.0f} | {mfu} | {r['max_reserved_gb']:.1f} |")
    for name, prof in ((n, r["profile"]) for n, r in results.items() if isinstance(r, dict) and "profile" in r):
        lines += ["", f"Profiled update ({name}): wall {prof['profiled_wall_s']:.3f} s, GPU busy {prof['gpu_busy_s']:.3f} s "
                      f"({100 * prof['gpu_busy_share']:.0f}%), {prof['kernels']} kernels, {prof.get('syncs', '?')} host syncs.", "",
                  "| kernel kind | GPU s |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in prof["by_kind_s"].items()]
        lines += ["", "| top kernels | GPU s |", "|---|---|"] + [f"| `{k}` | {v:.3f} |" for k, v in prof["top_kernels_s"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
