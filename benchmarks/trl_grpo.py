"""TRL's GRPOTrainer (vLLM colocate) vs tunekit's GRPO (vllm backend) on one GPU, same shape.

Both train the Qwen2.5-0.5B preset (random init, tunekit's embedded tokenizer; TRL loads the checkpoint that
tunekit's own export writes) on tunekit's arithmetic prompts, the same prompts at each step, with the same
prompts per step, samples per prompt, fixed generation length, micro-batch, learning rate, clip range and KL
coefficient, and one optimizer step per generation batch. Each framework runs in its own process tree, TRL
first. Writes OUT/trl_grpo_ENGINE.{json,md}; TRL's raw rows and log: OUT/trl_raw_ENGINE.json, OUT/trl_log_ENGINE.txt; tunekit's
run dir: OUT/runs/.

    pip install -e ".[vllm,trl]" && python3 benchmarks/trl_grpo.py --mode both --out "$OUT"
    OMP_NUM_THREADS=1 python3 benchmarks/trl_grpo.py --cpu-smoke --mode both --out "$OUT"      # CPU: the wiring only
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

T0 = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

ENGINES = {"eager": (True, False), "graphs": (False, False), "vllm-default": (False, True)}  # enforce_eager, torch_compile
GPU_DEFAULTS = dict(steps=8, prompts=64, gens=4, new_tokens=128, micro=16)
SMOKE_DEFAULTS = dict(steps=4, prompts=8, gens=2, new_tokens=4, micro=8)
PREP = "prepare (gen + reward + old logprobs + adv)"
DEFINITION = ("tokens/s/GPU = generated response tokens summed over the steady steps (all but the first {w}) / their "
              "summed step time / GPUs. A step is one generation batch: sampling, scoring, logprobs, one optimizer step "
              "and the weight sync into the engine. TRL: on_step_begin..on_step_end of a TrainerCallback, with "
              "torch.cuda.synchronize; tokens = len(completion_ids) the reward function sees. tunekit: timing_s/step; "
              "tokens = response_length/mean x samples per step.")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["trl", "tunekit", "both"], default="both")
    for k in GPU_DEFAULTS:
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, help=f"default {GPU_DEFAULTS[k]} (--cpu-smoke {SMOKE_DEFAULTS[k]})")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the steady figures")
    ap.add_argument("--engine", choices=list(ENGINES), default="eager",
                    help="vLLM in both: eager (tunekit's default), graphs (decode CUDA graphs, no torch.compile) or "
                         "vllm-default (torch.compile + CUDA graphs, what TRL gets by default); TRL's LLM(...) is given "
                         "tunekit's engine_io.compilation_config for the same knobs")
    ap.add_argument("--trl-compile", action="store_true", help="TRL: torch_compile=True (the model compiled whole)")
    ap.add_argument("--trl-is-correction", choices=["on", "off"], default="on",
                    help="TRL: vllm_importance_sampling_correction (on: TRL's default, an extra forward a step for the "
                         "old policy's logprobs; off: none, as tunekit's on-policy update)")
    ap.add_argument("--trl-liger", action="store_true",
                    help="TRL: use_liger_kernel=True when liger_kernel is importable (recorded either way)")
    ap.add_argument("--tunekit-set", action="append", default=[], metavar="KEY=VALUE", help="extra tunekit override")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                    help="run tunekit once per variant (after TRL, one after the other, on top of --tunekit-set); "
                         "its row is 'tunekit LABEL'. Default: one run, row 'tunekit'")
    ap.add_argument("--timeout", type=float, default=270.0, help="seconds per framework at most")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    ap.add_argument("--cpu-smoke", action="store_true", help="embedded tiny model, HF generate, a few steps on CPU")
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for k, v in (SMOKE_DEFAULTS if args.cpu_smoke else GPU_DEFAULTS).items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    return args


def variants(args) -> dict[str, list[str]]:
    """Row name -> the extra overrides of that tunekit run."""
    out = {}
    for v in args.variant:
        label, _, sets = v.partition(":")
        out[f"tunekit {label.strip()}"] = [kv.strip() for kv in sets.split(",") if kv.strip()]
    return out or {"tunekit": []}


def recipe_for(args, extra: list[str] = ()):
    """The tunekit recipe both runs are built from: model, tokenizer, task, batch, algorithm."""
    from tunekit.config import load_recipe

    sets = ["algorithm.name=grpo", f"probe.steps={args.steps}", f"probe.warmup_steps={args.warmup}",
            f"probe.timeout_s={args.timeout}", "profiler.comm_steps=0", f"system.batch.prompts_per_step={args.prompts}",
            f"system.batch.samples_per_prompt={args.gens}", f"system.batch.micro_batch_size={args.micro}",
            f"task.max_new_tokens={args.new_tokens}", "task.fixed_length=true"]
    if args.cpu_smoke:
        return load_recipe(None, sets + ["system.rollout.backend=hf"] + args.tunekit_set + list(extra))
    eager, compile_ = ENGINES[args.engine]
    engine = [f"system.rollout.enforce_eager={str(eager).lower()}", f"system.rollout.torch_compile={str(compile_).lower()}"]
    return load_recipe("qwen2.5-0.5b", sets + ["system.rollout.backend=vllm", "system.rollout.enable_sleep=true",
                                               "system.rollout.gpu_memory_utilization=0.35"] + engine + args.tunekit_set
                       + list(extra))


def liger_importable() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def trl_extras(args) -> dict:
    """GRPOConfig arguments beyond TRL's defaults that --trl-* ask for."""
    out = {"torch_compile": args.trl_compile}
    if not args.cpu_smoke:  # the correction exists with vLLM only
        out["vllm_importance_sampling_correction"] = args.trl_is_correction == "on"
    if args.trl_liger and liger_importable():
        out["use_liger_kernel"] = True
    return out


def run_trl(args, recipe, tmp: Path) -> dict:
    """TRL's GRPOTrainer in this process (the --trl-worker child); one row per optimizer step.

    ``tmp`` takes the preset's checkpoint (~1 GB) and TRL's output_dir."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tunekit.placement.gpus import nvml_indices
    from tunekit.workload.models import EMBEDDED_MODEL_DIR
    from tunekit.profiler.nvml import NvmlSampler
    from tunekit.workload.seeds import step_rng
    from tunekit.workload import Prompt
    from tunekit.trainer import build
    from tunekit.trainer.rollout.checkpoint import export_checkpoint, max_model_len

    gpu = not args.cpu_smoke
    if gpu and args.engine != "vllm-default":  # TRL passes neither to vllm.LLM: give it what tunekit's engine gets
        import functools

        import trl.generation.vllm_generation as vg
        from tunekit.trainer.rollout.engine_io import compilation_config

        rc = recipe.system.rollout
        cc = compilation_config(rc.enforce_eager, rc.torch_compile)
        vg.LLM = functools.partial(vg.LLM, enforce_eager=rc.enforce_eager, **({"compilation_config": cc} if cc else {}))
    tok, task, m, a = build.load_tokenizer(recipe), build.build_task(recipe), recipe.model, recipe.algorithm
    src = m.path or (None if m.preset else str(EMBEDDED_MODEL_DIR))  # as tunekit's rollout_checkpoint picks it
    policy = build.build_policy(recipe, tok) if src is None else None  # tunekit's initial weights, same seed
    model_dir = export_checkpoint(policy, tok, path=src, out_dir=tmp / "model")
    del policy
    # the prompts tunekit's loop samples at step s (Trainer.sample_prompts), in that order
    prompts = [p for s in range(args.steps) for p in task.sample(args.prompts, step_rng(recipe.probe.seed, s))]
    data = Dataset.from_dict({"prompt": [p.text for p in prompts], "answer": [p.answer for p in prompts]})
    seen = {"tokens": 0}

    def arithmetic_reward(prompts, completions, answer, completion_ids, **_):
        seen["tokens"] += sum(len(ids) for ids in completion_ids)
        return [task.score(Prompt(p, ans), c) for p, c, ans in zip(prompts, completions, answer)]

    samples, n = args.prompts * args.gens, args.new_tokens
    # fixed length as tunekit's engine does it (EOS masked until the budget); no detokenizing in the engine either
    fixed = {"min_tokens": n, "ignore_eos": True, "detokenize": False} if gpu else {"min_new_tokens": n}
    cfg = GRPOConfig(
        output_dir=str(tmp / "out"), max_steps=args.steps, per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=samples // args.micro, steps_per_generation=samples // args.micro,
        num_generations=args.gens, num_iterations=a.ppo_epochs, max_completion_length=n, generation_kwargs=fixed,
        temperature=recipe.task.temperature, beta=a.kl_coef, epsilon=a.clip_ratio, learning_rate=a.actor_lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=a.max_grad_norm, seed=recipe.probe.seed,
        bf16=gpu, gradient_checkpointing=recipe.system.memory.gradient_checkpointing, shuffle_dataset=False,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, model_init_kwargs={"dtype": "float32"},
        use_vllm=gpu, vllm_mode="colocate", vllm_gpu_memory_utilization=recipe.system.rollout.gpu_memory_utilization,
        vllm_enable_sleep_mode=gpu and recipe.system.rollout.enable_sleep, vllm_max_model_length=max_model_len(model_dir, n),
        **trl_extras(args),
    )
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    phases: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args_, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args_, **kwargs)
            finally:
                sync()
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.rows, self.logs, self.first = [], [], None

        def on_step_begin(self, *_, **__):
            sync()
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            phases.clear()
            self.t0, self.tok0, self.first = time.perf_counter(), seen["tokens"], self.first or time.monotonic()

        def on_step_end(self, *_, **__):
            sync()
            row = {"step": len(self.rows), "step_s": time.perf_counter() - self.t0, "tokens": seen["tokens"] - self.tok0}
            row |= {f"phase/{k}": v for k, v in phases.items()}
            if gpu:
                row["max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
            self.rows.append(row)
            print(f"trl step {row['step']}: {row['step_s']:.2f} s, {row['tokens']} tokens", flush=True)
            # the rows so far: a run stopped at its time limit keeps them
            (args.out / f"trl_raw_{args.engine}.json").write_text(json.dumps(
                {"status": "running", "steps": self.rows, "logs": self.logs, "gpus": 1,
                 "startup_s": self.first - T0}, default=str))

        def on_log(self, *_, logs=None, **__):
            self.logs.append(dict(logs or {}))

    timer = StepTimer()
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=arithmetic_reward, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[timer])
    trainer._generate_and_score_completions = timed(PREP, trainer._generate_and_score_completions)
    trainer._generate = timed("gen (incl. update_weights)", trainer._generate)
    if getattr(trainer, "vllm_generation", None) is not None:  # wake the engine's weights and push the actor's
        trainer.vllm_generation.sync_weights = timed("update_weights", trainer.vllm_generation.sync_weights)
    nvml = NvmlSampler(nvml_indices([torch.cuda.current_device()]), interval_s=0.2) if gpu else None
    with nvml or contextlib.nullcontext():
        trainer.train()
    return {"status": "ok", "steps": timer.rows, "logs": timer.logs, "gpus": 1, "nvml": nvml.summary() if nvml else {},
            "startup_s": (timer.first or time.monotonic()) - T0, "wall_s": time.monotonic() - T0}


def launch_trl(args) -> dict:
    """Run the TRL side in a child process: its CUDA context and engine are gone before tunekit starts."""
    from tunekit.placement.ports import free_port

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if not args.cpu_smoke:  # vLLM's external_launcher joins a torch.distributed group, also for one process
        env |= dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    raw, t0 = args.out / f"trl_raw_{args.engine}.json", time.monotonic()
    raw.unlink(missing_ok=True)
    with (args.out / f"trl_log_{args.engine}.txt").open("w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--trl-worker"] + sys.argv[1:], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if raw.exists():
        done = json.loads(raw.read_text())
        if done.get("status") != "running":
            return done
        # stopped mid-run: the steps it finished stay, with why it stopped
        why = f"timeout after {args.timeout:g} s" if time.monotonic() - t0 >= args.timeout else f"exit {proc.returncode}"
        return done | {"status": "timeout" if why.startswith("timeout") else "failed", "reason": f"{why} after "
                       f"{len(done.get('steps', []))} steps"}
    tail = " | ".join((args.out / f"trl_log_{args.engine}.txt").read_text(errors="replace").strip().splitlines()[-8:])[-800:]
    why = f"timeout after {args.timeout:g} s" if time.monotonic() - t0 >= args.timeout else f"exit {proc.returncode}"
    return {"status": "failed", "reason": f"{why}: {tail}", "steps": []}


def steady(step_s: list[float], tokens: list[float], warmup: int, gpus: int) -> dict:
    """Steady figures, and the warm-up steps' time beyond steady steps: compilation (torch.compile's first
    traces and any recompile) and first-run costs, apart from the steady step time."""
    s, t = step_s[warmup:], tokens[warmup:]
    if not s:
        return {"steady_steps": 0, "first_step_s": step_s[0] if step_s else None}
    median = statistics.median(s)
    return {"steady_steps": len(s), "step_s_median": median, "step_s_mean": sum(s) / len(s),
            "tokens_per_step": sum(t) / len(t), "tokens_per_s_per_gpu": sum(t) / sum(s) / gpus,
            "first_step_s": step_s[0], "warmup_extra_s": sum(x - median for x in step_s[:warmup])}


def nvml_peak(summary: dict) -> float | None:
    return max((v for k, v in summary.items() if k.startswith("nvml/mem_used_gb/")), default=None)


def trl_row(raw: dict, warmup: int) -> dict:
    rows, row = raw.get("steps", []), {k: raw.get(k) for k in ("status", "reason", "startup_s", "wall_s")}
    row |= steady([r["step_s"] for r in rows], [r["tokens"] for r in rows], warmup, raw.get("gpus", 1))
    row["max_memory_reserved_gb"] = max((r["max_memory_reserved_gb"] for r in rows if "max_memory_reserved_gb" in r), default=None)
    row["nvml_peak_gb"] = nvml_peak(raw.get("nvml") or {})
    own = [lg["step_time"] for lg in raw.get("logs", []) if "step_time" in lg][warmup:]  # TRL's own timer: a cross-check
    row["trl_logged_step_time_median"] = statistics.median(own) if own else None
    keys = sorted({k for r in rows[warmup:] for k in r if k.startswith("phase/")})
    row["phases_s"] = {k[6:]: statistics.median(r.get(k, 0.0) for r in rows[warmup:]) for k in keys}
    if PREP in row["phases_s"]:
        row["phases_s"]["update_actor (step - prepare)"] = row["step_s_median"] - row["phases_s"][PREP]
    return row


def tunekit_row(result, recipe, warmup: int) -> dict:
    from tunekit.rundir import read_steps

    s, steps = result.summary, read_steps(result.run_dir)
    row = {k: s.get(k) for k in ("status", "reason", "startup_s", "wall_s", "resolved/fsdp", "resolved/compile",
                                 "resolved/master_weights", "resolved/cuda_graphs")}
    row["run_dir"] = str(result.run_dir)
    if len(steps) == 0:
        return row | {"steady_steps": 0}
    tokens = steps["response_length/mean"] * recipe.system.batch.samples_per_step
    row |= steady(steps["timing_s/step"].tolist(), tokens.tolist(), warmup, recipe.system.world_size)
    if "perf/max_memory_reserved_gb" in steps:
        row["max_memory_reserved_gb"] = float(steps["perf/max_memory_reserved_gb"].max())
    row["nvml_peak_gb"] = nvml_peak(s)
    cols = [c for c in steps.columns if c.startswith("timing_s/") and c != "timing_s/step"]
    row["phases_s"] = {c[9:]: float(steps[c].iloc[warmup:].median()) for c in cols}
    gc_cols = [c for c in steps.columns if c.startswith("perf/gc_s")]  # garbage-collection pauses, per step
    row["gc_s_max"] = {c[5:]: float(steps[c].iloc[warmup:].max()) for c in gc_cols}
    if "rollout/logprob_abs_diff_mean" in steps:  # the on-policy check: engine vs actor logprobs
        row["logprob_abs_diff_max"] = float(steps["rollout/logprob_abs_diff_mean"].max())
    return row


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def _f(v, spec=".3g") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def markdown(res: dict) -> str:
    meta, rows = res["meta"], res["rows"]
    base = rows.get("trl", {}).get("tokens_per_s_per_gpu")
    out = [f"# TRL GRPOTrainer vs tunekit GRPO ({meta['device']}, {meta['date']})", "", f"Command: `{meta['command']}`",
           "", f"Shape: {meta['shape']}", "", f"Versions: {meta['versions']}", "",
           "TRL's settings beyond its defaults: " + ", ".join(f"{k}={v}" for k, v in meta.get("trl_settings", {}).items()),
           "", "tunekit's training path: " + "; ".join(
               f"{n}: FSDP2 {r.get('resolved/fsdp')}, compiled {r.get('resolved/compile')}, "
               f"master weights {r.get('resolved/master_weights')}, CUDA graphs {r.get('resolved/cuda_graphs')}"
               for n, r in rows.items()
               if n != "trl"), "",
           "| framework | status | steady steps | step s (median) | tokens/step | tokens/s/GPU | ratio vs TRL | "
           "first step s | warm-up beyond steady s | reserved peak GiB | NVML peak GiB | startup s | wall s |",
           "|" + "---|" * 13]
    for name, r in rows.items():
        tps = r.get("tokens_per_s_per_gpu")
        out.append(f"| {name} | {r.get('status')} | {r.get('steady_steps', 0)} | {_f(r.get('step_s_median'))} | "
                   f"{_f(r.get('tokens_per_step'), '.0f')} | {_f(tps, ',.0f')} | {_f(tps / base if tps and base else None, '.2f')} | "
                   f"{_f(r.get('first_step_s'))} | {_f(r.get('warmup_extra_s'))} | {_f(r.get('max_memory_reserved_gb'))} | {_f(r.get('nvml_peak_gb'))} | {_f(r.get('startup_s'))} | "
                   f"{_f(r.get('wall_s'))} |")
    out += [f"- {n}: `{', '.join(r['overrides'])}`" for n, r in rows.items() if r.get("overrides")]
    out += ["", meta["definition"], "", "Peaks: reserved = max over steps of torch.cuda.max_memory_reserved in the "
            "training process (a sleep-mode vLLM pool may escape it); NVML = the GPU's used memory over the whole run.",
            "", "Work that differs: neither loads a reference model at KL 0; tunekit skips its old-logprob pass when the "
            "update is exactly on-policy (one epoch, one mini-batch), TRL computes old logprobs only when it needs them "
            "too. Both engines sleep at level 2 (weights dropped, re-pushed each step) unless a tunekit row sets "
            "system.rollout.sleep_level=1 (weights parked in host memory). TRL's requests carry no seed, tunekit's "
            "one per row (the same kernel in vLLM 0.25: its sampler draws every row's noise from the row's seed).", ""]
    for name, r in rows.items():
        step = r.get("step_s_median")
        if r.get("phases_s") and step:
            out += [f"## {name} phases (median over steady steps)", "", "| phase | s | share of step |", "|---|---|---|"]
            out += [f"| {k} | {v:.3g} | {100 * v / step:.0f}% |" for k, v in r["phases_s"].items()] + [""]
        if r.get("gc_s_max"):
            out += ["Longest garbage-collection pause in a steady step: " +
                    ", ".join(f"{k} {v:.3g} s" for k, v in r["gc_s_max"].items()), ""]
        if r.get("logprob_abs_diff_max") is not None:
            out += [f"Largest mean |engine - actor| logprob in a step: {r['logprob_abs_diff_max']:.3g}", ""]
    fails = [f"- {n}: {r['reason'][:600]}" for n, r in rows.items() if r.get("reason")]
    return "\n".join(out + (["Failures:"] + fails if fails else [])) + "\n"


def main() -> int:
    args = parse()
    for k, v in dict(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                     VLLM_USE_FLASHINFER_SAMPLER="0").items():  # nothing is fetched: fail at once rather than wait
        os.environ.setdefault(k, v)
    if args.cpu_smoke:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.prompts * args.gens % args.micro or args.gens < 2:
        print("trl_grpo: --micro must divide --prompts x --gens, and --gens must be at least 2.", file=sys.stderr)
        return 2
    need = (["trl", "datasets"] if args.mode != "tunekit" else []) + ([] if args.cpu_smoke else ["vllm"])
    missing = [p for p in need if importlib.util.find_spec(p) is None]
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("trl_grpo: needs an NVIDIA GPU (or --cpu-smoke); run it on the H200 machine.", file=sys.stderr)
        return 2
    if missing:
        print(f"trl_grpo: {', '.join(missing)} not importable; install them first: pip install -e '.[vllm,trl]'", file=sys.stderr)
        return 2
    if any(":" not in v for v in args.variant):
        print("trl_grpo: --variant takes LABEL:KEY=VALUE[,KEY=VALUE], e.g. plain:system.memory.fsdp_single_gpu=false.",
              file=sys.stderr)
        return 2
    recipe = recipe_for(args)
    tunekit_runs = variants(args)
    runs = {name: recipe_for(args, extra) for name, extra in tunekit_runs.items()}  # a bad key fails before any run
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trl_worker:
        tmp = Path(tempfile.mkdtemp(prefix="trl-grpo-"))
        try:
            raw = run_trl(args, recipe, tmp)
        except Exception as e:  # the traceback goes to trl_log.txt, the sentence to the parent
            import traceback

            traceback.print_exc()
            status = "oom" if "out of memory" in str(e).lower() else "failed"
            raw = {"status": status, "reason": f"{type(e).__name__}: {e}"[:800], "steps": []}
        (args.out / f"trl_raw_{args.engine}.json").write_text(json.dumps(raw, indent=2, default=str))
        shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0 if raw["status"] == "ok" else 1)  # skip engine/NCCL teardown at exit, which can hang

    from tunekit.profiler.nvml import gpu_names  # not torch.cuda: a context here would sit on the GPU during both runs

    a, engine = recipe.algorithm, "HF generate" if args.cpu_smoke else f"vLLM colocated (sleep, util 0.35, {args.engine})"
    shape = (f"{recipe.model.preset or 'embedded tiny-arith'}, GRPO, {args.prompts} prompts x {args.gens} samples x "
             f"{args.new_tokens} new tokens (fixed length), micro-batch {args.micro}, one optimizer step a step, "
             f"lr {a.actor_lr:g}, clip {a.clip_ratio:g}, KL {a.kl_coef:g}, {engine}, {args.steps} steps")
    pkgs = ", ".join(f"{p} {_version(p)}" for p in ("torch", "transformers", "trl", "datasets", "vllm"))
    meta = {"device": "CPU (smoke)" if args.cpu_smoke else (gpu_names() or ["GPU"])[0], "date": time.strftime("%Y-%m-%d %H:%M"),
            "versions": pkgs, "shape": shape, "command": "python3 benchmarks/trl_grpo.py " + " ".join(sys.argv[1:]),
            "definition": DEFINITION.format(w=args.warmup),
            "trl_settings": trl_extras(args) | {"bf16": not args.cpu_smoke, "gradient_checkpointing":
                                                 recipe.system.memory.gradient_checkpointing,
                                                 "liger_kernel": "importable" if liger_importable() else "not importable"}}
    res: dict = {"meta": meta, "rows": {}}
    if args.mode in ("trl", "both"):
        print(f"TRL: {shape}", flush=True)
        res["rows"]["trl"] = trl_row(launch_trl(args), args.warmup)
        print(f"TRL: {res['rows']['trl']['status']} {res['rows']['trl'].get('reason') or ''}"[:400], flush=True)
        write_results(args, res)
    if args.mode in ("tunekit", "both"):
        from tunekit.launch.probe import run_probe

        for name, extra in tunekit_runs.items():
            print(f"{name} {' '.join(extra)}: {shape}", flush=True)
            result = run_probe(runs[name], out=args.out / "runs", run_id=f"tunekit-grpo-{time.strftime('%H%M%S')}")
            res["rows"][name] = tunekit_row(result, runs[name], args.warmup) | {"overrides": extra}
            write_results(args, res)
    print(markdown(res))
    return 0 if all(r.get("status") == "ok" for r in res["rows"].values()) else 1


def write_results(args, res: dict) -> None:
    """The tables as they stand, after every row: a run stopped at its time limit keeps the rows it finished."""
    trl_tps = res["rows"].get("trl", {}).get("tokens_per_s_per_gpu")
    res["ratio_tunekit_over_trl"] = {n: r["tokens_per_s_per_gpu"] / trl_tps for n, r in res["rows"].items()
                                     if n != "trl" and trl_tps and r.get("tokens_per_s_per_gpu")}
    (args.out / f"trl_grpo_{args.engine}.json").write_text(json.dumps(res, indent=2, default=str))
    (args.out / f"trl_grpo_{args.engine}.md").write_text(markdown(res))


if __name__ == "__main__":
    sys.exit(main())
