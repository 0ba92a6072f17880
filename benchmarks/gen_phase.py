"""Where a colocated vLLM engine's generation phase goes, on one GPU: sampling, sleep, wake, weight sync.

GRPO 64 prompts x 4 samples x 128 new tokens (fixed length) on a Qwen2.5 preset (random init, embedded tokenizer), the
in-process engine built as a probe builds it (``build_rollout``), decode CUDA graphs. After one warm-up generation,
``--reps`` rounds of: generate, sleep, wake, weight sync (the actor's bf16 weights), each timed on its own; then the
same generations with the rows' sampling seeds left out (the engine's own generator draws for every row: the cost of
per-row seeds), with no logprobs asked for, and as at first again; then one generation under torch.profiler, whose
busiest host and device operators are listed.

    PYTHONPATH=. python3 benchmarks/gen_phase.py --out "$OUT"

Writes ``OUT/gen_phase.json`` (one compact table for benchmarks/collect.py) and ``OUT/gen_phase_profile.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

SHAPE = ["algorithm.name=grpo", "system.batch.prompts_per_step=64", "system.batch.samples_per_prompt=4",
         "task.max_new_tokens=128", "task.fixed_length=true", "system.rollout.backend=vllm", "system.device=cuda",
         "system.rollout.enforce_eager=false"]


def timed(fn) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def without(build, key: str):
    """``build_requests`` with every row's ``key`` (``seed``, ``logprobs``) left out."""
    def wrapped(*a, **k):
        rows, params = build(*a, **k)
        return rows, [p | {key: None} for p in params]
    return wrapped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more recipe overrides")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tunekit.config import load_recipe
    from tunekit.dist import Dist
    from tunekit.seeds import step_rng
    from tunekit.trainer import build
    from tunekit.trainer.batch import encode_prompts
    from tunekit.trainer.rollout import vllm_engine

    overrides = SHAPE + args.extra
    recipe = load_recipe(args.preset, overrides)
    tok, task = build.load_tokenizer(recipe), build.build_task(recipe)
    device = torch.device("cuda", 0)
    t0 = time.perf_counter()
    rollout = build.build_rollout(recipe, Dist(device=device), tok)
    startup_s = time.perf_counter() - t0
    actor = build.build_policy(recipe, tok).to(device, torch.bfloat16)
    b = recipe.system.batch

    def prompts(g: int):
        texts = [p.text for p in task.sample(b.prompts_per_step, step_rng(recipe.probe.seed, g)) for _ in
                 range(b.samples_per_prompt)]
        return encode_prompts(tok, texts)

    rollout.generate(prompts(0), seed=0)  # warm-up
    rows: dict[str, list[float]] = {"generate": [], "sleep": [], "wake": [], "sync": [], "generate, no row seeds": [],
                                    "generate, no logprobs": [], "generate again": []}
    for g in range(1, args.reps + 1):
        enc = prompts(g)
        rows["generate"].append(timed(lambda: rollout.generate(enc, seed=g)))
        rows["sleep"].append(timed(rollout.sleep))
        rows["wake"].append(timed(rollout.wake))
        rows["sync"].append(timed(lambda: rollout.sync_weights(actor.named_parameters())))
    seeded, sampled = vllm_engine.build_requests, vllm_engine.sampled_logprobs
    vllm_engine.build_requests = without(seeded, "seed")
    for g in range(1, args.reps + 1):
        enc = prompts(g)
        rows["generate, no row seeds"].append(timed(lambda: rollout.generate(enc, seed=g)))
    vllm_engine.build_requests = without(seeded, "logprobs")
    vllm_engine.sampled_logprobs = lambda tokens, _: [0.0] * len(tokens)
    for g in range(1, args.reps + 1):
        enc = prompts(g)
        rows["generate, no logprobs"].append(timed(lambda: rollout.generate(enc, seed=g)))
    vllm_engine.build_requests, vllm_engine.sampled_logprobs = seeded, sampled
    for g in range(1, args.reps + 1):  # the first rows again: what order alone moves
        enc = prompts(g)
        rows["generate again"].append(timed(lambda: rollout.generate(enc, seed=g)))
    enc = prompts(args.reps + 1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rollout.generate(enc, seed=args.reps + 1)
        torch.cuda.synchronize()
    avg = prof.key_averages()
    kernels = sum(e.count for e in avg if e.device_type.name == "CUDA")
    text = "\n\n".join([avg.table(sort_by="self_cpu_time_total", row_limit=25),
                        avg.table(sort_by="self_device_time_total", row_limit=20)])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gen_phase_profile.txt").write_text(text)
    runner = getattr(getattr(rollout.llm.llm_engine, "vllm_config", None), "use_v2_model_runner", None)
    table = {
        "meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(0),
                 "preset": args.preset, "overrides": overrides, "reps": args.reps, "startup_s": startup_s,
                 "v2_model_runner": runner,
                 "command": "python3 benchmarks/gen_phase.py " + " ".join(sys.argv[1:])},
        "rows": {k: {"median_s": statistics.median(v), "all_s": v} for k, v in rows.items()},
        "profiled_generation": {"device_kernels": kernels},
    }
    (args.out / "gen_phase.json").write_text(json.dumps(table, indent=1))
    for k, v in table["rows"].items():
        print(f"{k:>24}: {v['median_s']:.4f} s  {['%.4f' % x for x in v['all_s']]}")
    print(f"v2 model runner: {runner}; kernels in one generation: {kernels}")
    print(text[:9000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
