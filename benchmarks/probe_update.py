"""The actor's update as a probe runs it, timed alone, with the MFU a probe's summary would give it
(``update_bench.py --probe-shape``; see that script's docstring).

The actor is built from the recipe by the trainer's own builder (so ``auto`` knobs resolve as in a probe on
this device); each update trains on the batch a probe's step would hold: the task's prompts of that step,
tokenized and left-padded by the trainer's own functions, ``task.max_new_tokens`` response tokens (no EOS, as a
fixed-length probe generates them), random GRPO advantages. No generation, no engine: the update alone.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

import torch

BEFORE_AUTO = ["system.memory.fsdp_single_gpu=true", "system.compile=false"]
"""The training path a one-GPU probe ran before ``auto``: FSDP2, eager."""
BEFORE_AUTO_VARIANT = ["before auto (FSDP2, eager):" + ",".join(BEFORE_AUTO)]


def recipe_for(args, extra: list[str]):
    from tunekit.config import RECIPES_DIR, load_recipe

    sets = ["algorithm.name=grpo", "system.batch.samples_per_prompt=4"]
    if args.cpu_smoke:  # the embedded model, a small batch: checks the wiring only
        return load_recipe(None, sets + ["system.device=cpu", "system.batch.prompts_per_step=4", "task.max_new_tokens=6",
                                         "task.fixed_length=true", "system.batch.micro_batch_size=4", "probe.warmup_steps=1"]
                           + args.set + extra)
    name = args.preset if (RECIPES_DIR / f"{args.preset}.yaml").exists() else None
    preset = [] if name else [f"model.preset={args.preset}", "task.max_new_tokens=128", "task.fixed_length=true",
                              "system.batch.prompts_per_step=64", "system.batch.micro_batch_size=16"]
    return load_recipe(name, sets + preset + args.set + extra)


def step_batch(recipe, tok, task, step: int, vocab: int) -> dict[str, torch.Tensor]:
    """The batch a probe's step ``step`` trains on (prompts as :meth:`Trainer.sample_prompts` draws them)."""
    from tunekit.workload.seeds import step_rng
    from tunekit.trainer.batch import assemble, encode_prompts

    b = recipe.system.batch
    prompts = [p for p in task.sample(b.prompts_per_step, step_rng(recipe.probe.seed, step))
               for _ in range(b.samples_per_prompt)]
    enc = encode_prompts(tok, [p.text for p in prompts])
    g = torch.Generator().manual_seed(step)
    resp = torch.randint(0, vocab, (len(prompts), recipe.task.max_new_tokens), generator=g)
    resp = torch.where(resp == tok.eos_token_id, (resp + 1) % vocab, resp)  # fixed length: no early EOS
    batch = assemble(enc, resp, tok.eos_token_id)
    batch["advantages"] = torch.randn(resp.shape, generator=g) * batch["response_mask"]
    return batch


def time_variant(recipe, args, dist, profile, *, gpu: bool) -> dict:
    from tunekit.launch.probe import perf_metrics
    from tunekit.runners import runner_for
    from tunekit.trainer import build
    from update_bench import kernel_breakdown, sync

    tok, task = build.load_tokenizer(recipe), build.build_task(recipe)
    torch.manual_seed(recipe.probe.seed)
    policy = build.build_policy(recipe, tok)
    vocab = policy.config.vocab_size
    actor = build.build_actor(recipe, dist, policy)
    warm, mini = recipe.probe.warmup_steps, recipe.system.batch.mini_batch // dist.world
    times, tokens, lengths = [], [], []
    for step in range(warm + args.reps):
        batch = step_batch(recipe, tok, task, step, vocab)
        sync()
        t0 = time.perf_counter()
        actor.update(batch, mini_batch=mini, seed=step)
        sync()
        times.append(time.perf_counter() - t0)
        tokens.append(float(batch["attention_mask"].sum()))
        lengths.append(float(batch["response_mask"].sum(-1).float().mean()))
        print(f"  update {step}: {times[-1]:.3f} s", flush=True)
    sec = statistics.median(times[warm:])
    # the steady medians a probe's summary reads perf/mfu/actor from
    steady = {"perf/total_tokens": statistics.fmean(tokens[warm:]), "timing_s/step": sec,
              "timing_s/update_actor": sec, "response_length/mean": statistics.fmean(lengths[warm:])}
    row = runner_for(recipe).training_path(recipe, gpu=gpu) | {
        "micro": recipe.system.batch.micro_batch, "rows": recipe.system.batch.samples_per_step,
        "update_s": sec, "first_update_s": times[0], "warmup_s": times[:warm], "times_s": times[warm:],
        "tokens_per_update": steady["perf/total_tokens"], "tokens_per_s": steady["perf/total_tokens"] / sec,
        "mfu": perf_metrics(recipe, steady, 1, profile).get("perf/mfu/actor"),
        "max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30 if gpu else 0.0}
    if args.profile:  # one more update under torch.profiler: GPU-busy share, host syncs, kernel kinds
        row["profile"] = kernel_breakdown(actor, step_batch(recipe, tok, task, warm + args.reps, vocab))
    del actor, policy
    return row


def run(args) -> int:
    from tunekit.placement.dist import init_from_env
    from tunekit.config.errors import TunekitError
    from tunekit.estimate.profiles import match_profile

    variants = {"default": []}
    for v in BEFORE_AUTO_VARIANT if args.probe_variant is None else args.probe_variant:
        label, _, sets = v.partition(":")
        variants[label.strip()] = [kv.strip() for kv in sets.split(",") if kv.strip()]
    try:
        recipes = {label: recipe_for(args, extra) for label, extra in variants.items()}  # bad keys fail first
    except TunekitError as e:
        print(f"update_bench --probe-shape: {e.message}", file=sys.stderr)
        return 2
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    gpu = not args.cpu_smoke
    dist = init_from_env("cuda" if gpu else "cpu")
    gpu_name = torch.cuda.get_device_name() if gpu else "cpu"
    profile = match_profile(gpu_name) if gpu else None
    args.profile = [] if args.cpu_smoke else args.profile
    base = recipes["default"]
    b = base.system.batch
    res = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "device": gpu_name, "torch": torch.__version__,
                    "command": "python3 benchmarks/update_bench.py " + " ".join(sys.argv[1:]),
                    "shape": f"{base.model.preset or 'embedded'}, {base.algorithm.name}, {b.prompts_per_step} prompts x "
                             f"{b.samples_per_prompt} samples x {base.task.max_new_tokens} tokens, micro-batch {b.micro_batch}",
                    "peak_bf16_tflops": profile.peak_bf16_tflops if profile else None,
                    "mfu": "perf/mfu/actor's formula (tunekit.launch.probe.perf_metrics) over the median steady update"},
           "rows": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"update_probe-{base.model.preset or 'cpu'}"
    for label, recipe in recipes.items():
        print(f"{label}: {' '.join(variants[label]) or '(recipe defaults)'}", flush=True)
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            row = time_variant(recipe, args, dist, profile, gpu=gpu)
        except Exception as e:  # an OOM is a result here
            row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        res["rows"][label] = {"overrides": variants[label]} | row
        (args.out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
        (args.out / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))
    return 0 if all("error" not in r for r in res["rows"].values()) else 1



def markdown(res: dict) -> str:
    m = res["meta"]
    out = [f"In-probe actor update: {m['shape']}, {m['device']}, peak {m['peak_bf16_tflops']} TFLOP/s, torch {m['torch']}",
           "", f"Command: `{m['command']}`", "", f"MFU: {m['mfu']}.", "",
           "| row | FSDP2 | compiled | master weights | update s | first update s | tokens/s | MFU | reserved peak GiB |",
           "|" + "---|" * 9]
    for label, r in res["rows"].items():
        if "error" in r:
            out.append(f"| {label} | {r['error']} | | | | | | | |")
            continue
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        out.append(f"| {label} | {r['resolved/fsdp']} | {r['resolved/compile']} | {r.get('resolved/master_weights')} | "
                   f"{r['update_s']:.3f} | "
                   f"{r['first_update_s']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {r['max_reserved_gb']:.1f} |")
    for label, r in res["rows"].items():
        if "profile" in r:
            p = r["profile"]
            out += ["", f"Profiled update ({label}): wall {p['profiled_wall_s']:.3f} s, GPU busy {p['gpu_busy_s']:.3f} s "
                        f"({100 * p['gpu_busy_share']:.0f}%), {p['kernels']} kernels, {p['syncs']} host syncs; by kind: "
                        + ", ".join(f"{k} {v:.3f} s" for k, v in p["by_kind_s"].items())]
    return "\n".join(out) + "\n"
