"""vLLM engine knobs on one GPU: generation time vs gpu_memory_utilization, max_num_seqs and prefix caching, and the
memory estimate vs the measured peak over the same runs.

GRPO 64 prompts x 4 samples x 128 new tokens (fixed length) on Qwen2.5 presets (random init, embedded tokenizer).
Per preset, engine runs of the in-process engine alone (``VLLMRollout``, as probes build it): a baseline
(utilization 0.5, max_num_seqs 256, prefix caching on, run again after the utilization runs) and one change at a
time (utilization 0.3 and 0.7, max_num_seqs 64, prefix caching off), one warm-up generation then ``--gens`` timed
ones; "vs base" divides by the mean of the two base runs. They run one after the
other in one worker process per preset (an engine is shut down and its memory returned before the next starts;
where memory stays behind, the remaining runs move to a fresh worker, so every run starts on a clean GPU). Then
one probe (``tunekit.launch.probe.run_probe``: training beside a sleeping engine, the baseline's knobs), whose
record holds the whole estimate (``memory/estimate_gb``, every role) against NVML's peak.

    PYTHONPATH=. python3 benchmarks/engine_knobs.py --out "$OUT/engine"

Writes ``OUT/engine_knobs.json`` (one row per run, for benchmarks/collect.py), ``OUT/engine_knobs.md`` and the
probes' run directories under ``OUT/runs``; the JSON is rewritten after every run, so a run cut short keeps what it
measured. Each preset gets its share of ``--budget`` (what one leaves carries over): its probe first, then its
engine runs while the share lasts (the rest are recorded as skipped).

Memory: the estimate (``tunekit.estimate.memory``; an engine run's is :func:`engine_alone`: its pool plus one process's memory
outside the allocator) against NVML's peak used on the GPU (every process), sampled every 0.1 s in an engine run,
every ``profiler.nvml_interval_s`` in a probe; error = (estimate - measured) / measured. The allocator's peak
(``reserved_gb``) is listed too, but is not what the estimate counts.

``--dry-run`` prints the plan with each run's estimate and exits. On a machine without vLLM,
``--backend hf --presets default --device cpu`` runs the same plan through HF generation (a smoke test of the
script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

PRESETS = ["qwen2.5-0.5b", "qwen2.5-1.5b"]
SHAPE = ["algorithm.name=grpo", "system.batch.prompts_per_step=64", "system.batch.samples_per_prompt=4",
         "task.max_new_tokens=128", "task.fixed_length=true"]
BASE = {"system.rollout.gpu_memory_utilization": 0.5, "system.rollout.max_num_seqs": 256,
        "system.rollout.enable_prefix_caching": True}
VARIANTS = {"base": {}, "util_0.3": {"system.rollout.gpu_memory_utilization": 0.3},
            "util_0.7": {"system.rollout.gpu_memory_utilization": 0.7}, "base_repeat": {},
            "seqs_64": {"system.rollout.max_num_seqs": 64}, "prefix_off": {"system.rollout.enable_prefix_caching": False}}
"""One knob changed at a time. The base runs twice, first and after the utilization runs: the first engine of a
worker has been the slowest of its run on some hosts, so a change is read against the mean of the two, and their
difference shows how far the order alone moves a run."""
BASE_RUNS = ("base", "base_repeat")
ENGINE_KNOB_KEYS = ("system.rollout.max_num_seqs", "system.rollout.enable_prefix_caching")
"""vLLM-only knobs, left out when the plan runs on HF generation."""
MIN_START_S = 45.0
"""No engine run starts with less of its preset's share of the budget left."""
MIN_PROBE_S = 90.0
"""Nor a probe (it starts a trainer and an engine, and runs its steps)."""


@dataclass
class Job:
    preset: str
    name: str
    kind: str  # "engine" (the engine alone) or "probe" (training beside a sleeping engine)
    overrides: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.preset}/{self.name}"


def seqs_variant(n: int) -> str:
    """The engine run of ``--seqs N``: the baseline with ``max_num_seqs`` N."""
    return f"seqs_{n}"


def knob_sets(variant: str, backend: str) -> list[str]:
    if variant in VARIANTS:
        knobs = BASE | VARIANTS[variant]
    else:  # seqs_variant(N)
        knobs = BASE | {"system.rollout.max_num_seqs": int(variant.removeprefix("seqs_"))}
    if backend != "vllm":
        knobs = {k: v for k, v in knobs.items() if k not in ENGINE_KNOB_KEYS}
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]


def plan(presets: list[str], backend: str, device: str, extra: list[str], probe_steps: int,
         seqs: list[int] = ()) -> dict[str, list[Job]]:
    """Per preset, its probe (the whole estimate's test) and then its engine runs, the baseline first, then one run
    for each of ``seqs`` (:func:`seqs_variant`)."""
    common = SHAPE + [f"system.rollout.backend={backend}", f"system.device={device}"] + extra
    out = {}
    for p in presets:
        engine = [Job(p, v, "engine", common + ["system.rollout.enable_sleep=false"] + knob_sets(v, backend))
                  for v in [*VARIANTS, *(seqs_variant(n) for n in seqs if seqs_variant(n) not in VARIANTS)]]
        probe = Job(p, "probe", "probe", common + knob_sets("base", backend) + [
            "system.rollout.enable_sleep=true", f"probe.steps={probe_steps}", "probe.warmup_steps=1",
            "profiler.comm_steps=0"])
        out[p] = [probe] + engine
    return out


def error(estimate: float | None, measured: float | None) -> float | None:
    from tunekit.estimate.memory import estimate_error

    return estimate_error(estimate, measured)


def card_gib(device: str, profile_name: str | None = None) -> float | None:
    """The card's memory (GiB): the named price profile's, else that of the GPU NVML reports."""
    from tunekit.launch.probe import pick_profile

    profile = pick_profile(profile_name, device == "cuda")
    return profile.memory_gib if profile is not None else None


def engine_alone(recipe, shape, card_gib: float | None) -> float | None:
    """Estimated peak bytes of a GPU on which only the rollout generates (an engine on its own, a server's GPU):
    the rollout role's bytes plus one process's memory outside the allocator; None when the card is unknown."""
    from tunekit.estimate.memory import GIB, NON_TORCH_GIB, role_memory
    from tunekit.runners import runner_for

    card = None if card_gib is None else card_gib * GIB
    rollout = next(r for r in role_memory(recipe, shape, card, traits=runner_for(recipe).traits, graphs=False)
                   if r.role == "rollout")
    return None if rollout.total is None else rollout.total + NON_TORCH_GIB * GIB


def model_gen_s(job: Job, profile) -> float | None:
    """The cost model's generation seconds for the run (uncalibrated, the run's fixed lengths), None without a
    profile: what its ``gen s`` is set against."""
    from tunekit.config import load_recipe
    from tunekit.estimate.costmodel import predict
    from tunekit.runners import runner_for

    if profile is None:
        return None
    phases = predict(load_recipe(job.preset, job.overrides), profile, runners=runner_for).phases
    return next((p.seconds for p in phases if p.name == "gen"), None)


def estimate_gb(job: Job, card: float | None) -> float | None:
    """The run's estimated peak (GiB): the engine alone, or the probe's fullest GPU."""
    from tunekit.config import load_recipe
    from tunekit.estimate.memory import GIB, estimate_memory, model_shape
    from tunekit.runners import runner_for

    recipe = load_recipe(job.preset, job.overrides)
    shape = model_shape(recipe)
    peak = (engine_alone(recipe, shape, card) if job.kind == "engine"
            else estimate_memory(recipe, shape, card, traits=runner_for(recipe).traits).peak)
    return None if peak is None else peak / GIB


def _median(values: list[float]) -> float | None:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else None


# ------------------------------------------------------------------ an engine run (a fresh process)


def _nvml_index() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


LEFTOVER_GIB = 2.0
"""GPU memory still used after an engine's teardown, beyond what the worker held before its first engine (its
context with cuBLAS loaded), that sends the remaining runs to a fresh worker."""


def gpu_used_gib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def shut_down(llm) -> None:
    """Stop an in-process engine's core (its executor and workers)."""
    shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()


def free_gpu_memory() -> None:
    """Collect what the released engine left and give the memory back, as vLLM's own tests do between engines."""
    import gc

    import torch

    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:
        pass
    else:
        cleanup_dist_env_and_memory()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_run(job: Job, gens: int, card: float | None, engine_dir: str | None) -> dict:
    """Build the rollout as a probe does, generate once to warm up and ``gens`` times timed; NVML samples the GPU
    throughout (the engine's start included). The engine is released before this returns."""
    import torch

    from tunekit.config import load_recipe
    from tunekit.placement.dist import Dist
    from tunekit.estimate.memory import GIB
    from tunekit.profiler.nvml import NvmlSampler
    from tunekit.workload.seeds import step_rng
    from tunekit.trainer.batch import encode_prompts
    from tunekit.trainer.build import (
        build_policy,
        build_rollout,
        build_task,
        load_tokenizer,
    )

    recipe = load_recipe(job.preset, job.overrides)
    tok, task = load_tokenizer(recipe), build_task(recipe)
    device = torch.device("cuda", 0) if recipe.system.device == "cuda" else torch.device("cpu")
    used_before = gpu_used_gib() if device.type == "cuda" else None  # what the GPU held before this engine
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    b = recipe.system.batch
    gen_s, tokens, kv, preempted = [], [], [], []
    with NvmlSampler([_nvml_index()] if device.type == "cuda" else [], interval_s=0.1) as nvml:
        start = time.perf_counter()
        model = None if recipe.system.rollout.backend != "hf" else build_policy(recipe, tok).to(device)
        rollout = build_rollout(recipe, Dist(device=device), tok, model, engine_dir=engine_dir)
        startup_s = time.perf_counter() - start
        for g in range(gens + 1):
            prompts = [p.text for p in task.sample(b.prompts_per_step, step_rng(recipe.probe.seed, g))
                       for _ in range(b.samples_per_prompt)]
            enc = encode_prompts(tok, prompts)
            t = time.perf_counter()
            ids, _ = rollout.generate(enc, seed=g)
            dt = time.perf_counter() - t
            m = dict(getattr(rollout, "last_metrics", None) or {})
            if g == 0:
                continue  # warm-up
            gen_s.append(dt)
            # fixed length: every row is max_new_tokens long (a sampled token may equal the pad id)
            tokens.append(float(ids.numel() if recipe.task.fixed_length else (ids != tok.pad_token_id).sum()))
            kv.append(m.get("rollout/kv_usage_peak", float("nan")))
            preempted.append(m.get("rollout/preemptions", float("nan")))
    reserved = torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None
    llm = getattr(rollout, "llm", None)
    del rollout, model  # no reference left here, so the memory can go
    try:
        shut_down(llm)
        del llm
        free_gpu_memory()
    except Exception as e:  # noqa: BLE001 - the run is measured; memory left behind moves the rest to a fresh worker
        print(f"engine teardown failed ({type(e).__name__}: {e})", flush=True)
    measured = nvml.summary().get(f"nvml/mem_used_gb/{_nvml_index()}") if nvml.available else None
    est = estimate_gb(job, card)
    return {"status": "ok", "reason": "", "startup_s": startup_s, "gen_s": _median(gen_s),
            "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, gen_s)) if gen_s else None,
            "kv_usage_peak": max((v for v in kv if not math.isnan(v)), default=None),
            "preemptions": (sum(v for v in preempted if not math.isnan(v))
                            if any(not math.isnan(v) for v in preempted) else None),
            "est_peak_gb": est, "measured_peak_gb": measured, "error": error(est, measured), "reserved_gb": reserved,
            "used_before_gb": used_before}


def engine_worker(jobs: list[Job], gens: int, card: float | None, engine_dir: str | None, results: Path) -> int:
    """Run ``jobs`` one after the other in this process, each result written as it is done; exit code 3 when an
    engine left memory behind (the parent resumes the rest in a fresh worker)."""
    import torch

    on_gpu = torch.cuda.is_available() and any("system.device=cuda" in j.overrides for j in jobs)
    if on_gpu:  # the context and cuBLAS's workspace, which stay for every engine of this worker
        x = torch.ones(256, 256, device="cuda")
        (x @ x).sum().item()
    before = gpu_used_gib() if on_gpu else 0.0
    for i, job in enumerate(jobs):
        if i and on_gpu and (left := gpu_used_gib() - before) > LEFTOVER_GIB:
            print(f"{left:.1f} GiB still used after the previous engine: the rest runs in a fresh worker", flush=True)
            return 3
        row = engine_run(job, gens, card, engine_dir)
        (results / f"{job.key.replace('/', '_')}.json").write_text(json.dumps(row))
    return 0


def engine_jobs(jobs: list[Job], gens: int, card: float | None, deadline: float, out: Path) -> dict[str, dict]:
    """Run the engine jobs in worker processes (a fresh one whenever the last stopped or failed) until done or
    ``deadline`` (monotonic); returns a row per job that ran."""
    from tunekit.config import load_recipe
    from tunekit.placement.dist import Dist
    from tunekit.trainer.build import load_tokenizer, rollout_engine_dir

    results = out / "engine_rows"
    results.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(jobs[0].preset, jobs[0].overrides)
    engine_dir = rollout_engine_dir(recipe, Dist(), load_tokenizer(recipe))  # written once, on the CPU
    rows: dict[str, dict] = {}
    todo = list(jobs)
    while todo and deadline - time.monotonic() > MIN_START_S:
        for j in todo:
            (results / f"{j.key.replace('/', '_')}.json").unlink(missing_ok=True)
        log = results / f"{todo[0].key.replace('/', '_')}.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps([asdict(j) for j in todo]),
               "--gens", str(gens), "--card", str(card) if card is not None else "none",
               "--engine-dir", str(engine_dir) if engine_dir else "none", "--result", str(results)]
        try:
            with log.open("w") as f:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=deadline - time.monotonic(),
                                    check=False).returncode
        except subprocess.TimeoutExpired:
            rc = None
        done = [j for j in todo if (results / f"{j.key.replace('/', '_')}.json").exists()]
        for j in done:
            rows[j.key] = json.loads((results / f"{j.key.replace('/', '_')}.json").read_text())
        todo = [j for j in todo if j not in done]
        if todo and rc != 3:  # the run in progress failed (or the time ran out): recorded, the rest go on
            tail = " | ".join(log.read_text().strip().splitlines()[-3:])[-400:]
            rows[todo[0].key] = ({"status": "timeout", "reason": "the preset's share of the budget ran out"} if rc is None
                                 else {"status": "failed", "reason": f"exit code {rc}: {tail}"})
            todo = todo[1:]
    return rows


# ------------------------------------------------------------------ a probe (its own process tree)


def probe_job(job: Job, out: Path, timeout_s: float) -> dict:
    from tunekit.config import load_recipe
    from tunekit.launch.probe import run_probe
    from tunekit.rundir import read_steps

    recipe = load_recipe(job.preset, job.overrides + [f"probe.timeout_s={max(30.0, timeout_s):.0f}"])
    res = run_probe(recipe, out=out / "runs", run_id=f"{job.preset}-probe-{time.strftime('%H%M%S')}")
    s, steps = res.summary, read_steps(res.run_dir)
    steady = steps.iloc[1:] if len(steps) > 1 else steps

    def col(key: str) -> list[float]:
        return [float(v) for v in steady[key]] if key in steady else []

    kv, pre = col("rollout/kv_usage_peak"), col("rollout/preemptions")
    return {"status": s["status"], "reason": s.get("reason", ""), "startup_s": s.get("startup_s"),
            "gen_s": _median(col("timing_s/gen")), "tokens_per_s": _median(col("rollout/tokens_per_s")),
            "kv_usage_peak": max(kv) if kv else None, "preemptions": sum(pre) if pre else None,
            "est_peak_gb": s.get("memory/estimate_gb"), "measured_peak_gb": s.get("memory/measured_gb"),
            "error": s.get("memory/estimate_error"),
            "reserved_gb": float(steps["perf/max_memory_reserved_gb"].max()) if "perf/max_memory_reserved_gb" in steps else None,
            "steps": len(steps), "run_dir": str(res.run_dir)}


# ------------------------------------------------------------------ the table


def error_summary(rows: dict[str, dict]) -> dict:
    """Median and worst (largest in size) estimate error over the runs that measured one."""
    errs = [r["error"] for r in rows.values() if r.get("error") is not None]
    if not errs:
        return {"n": 0, "median": None, "worst": None}
    return {"n": len(errs), "median": statistics.median(errs), "worst": max(errs, key=abs)}


def fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def base_gen_s(rows: dict[str, dict], preset: str) -> float | None:
    """The preset's base generation time: the mean of its base runs that measured one."""
    gens = [rows.get(f"{preset}/{name}", {}).get("gen_s") for name in BASE_RUNS]
    gens = [g for g in gens if g]
    return statistics.fmean(gens) if gens else None


def markdown(rows: dict[str, dict], meta: dict) -> str:
    head = ("| run | kind | status | gen s | vs base | tokens/s | KV usage peak | preemptions | estimate GiB | "
            "NVML peak GiB | error | reserved GiB |")
    lines = [f"# vLLM engine knobs ({meta['gpu']}, {meta['date']})", "", f"Command: `{meta['command']}`", "",
             f"Shape: {meta['shape']}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for key, r in rows.items():
        base = base_gen_s(rows, key.split("/")[0])
        gen = r.get("gen_s")
        ratio = f"{gen / base:.2f}x" if gen and base and r.get("kind") == "engine" else "-"
        lines.append(" | ".join([f"| {key}", r.get("kind", ""), r["status"], fmt(gen), ratio, fmt(r.get("tokens_per_s"), ".0f"),
                                 fmt(r.get("kv_usage_peak")), fmt(r.get("preemptions"), ".0f"), fmt(r.get("est_peak_gb")),
                                 fmt(r.get("measured_peak_gb")), fmt(r.get("error"), "+.1%"), fmt(r.get("reserved_gb"))]) + " |")
    e = meta["estimate_error"]
    lines += ["", ("gen s, tokens/s: medians over the timed generations (engine runs) or the steady steps (probes); "
                   "KV usage peak: the fullest over them; preemptions: summed."),
              f"Estimate vs NVML peak: median {fmt(e['median'], '+.1%')}, worst {fmt(e['worst'], '+.1%')} over {e['n']} runs."]
    notes = [f"- {k}: {r['reason'][:300]}" for k, r in rows.items() if r.get("reason")]
    return "\n".join(lines + (["", "Not measured:"] + notes if notes else [])) + "\n"


def write(out: Path, rows: dict[str, dict], meta: dict) -> None:
    meta["estimate_error"] = error_summary(rows)
    (out / "engine_knobs.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (out / "engine_knobs.md").write_text(markdown(rows, meta))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=PRESETS, help="recipes to run (default: the 0.5B and 1.5B presets)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")) / "engine")
    ap.add_argument("--gens", type=int, default=3, help="timed generations per engine run (after one warm-up)")
    ap.add_argument("--probe-steps", type=int, default=3, help="steps per probe (the first is warm-up)")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds for all runs, shared among the presets")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"], help="hf: a smoke test without vLLM")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more recipe overrides (smoke tests)")
    ap.add_argument("--only", nargs="*", help="run only these runs (preset/name keys)")
    ap.add_argument("--seqs", nargs="*", type=int, default=[],
                    help="more engine runs, the baseline at each of these max_num_seqs (e.g. 128 256 512: generation "
                         "in 4, 2 and 1 waves, which splits an engine step's own cost from its sequences')")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and each run's estimate; run nothing")
    ap.add_argument("--gpu-profile", help="the card the estimates are for (default: the GPU NVML reports)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--card", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--engine-dir", default="none", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:  # engine runs, in this worker process
        card = None if args.card == "none" else float(args.card)
        return engine_worker([Job(**j) for j in json.loads(args.worker)], args.gens, card,
                             None if args.engine_dir == "none" else args.engine_dir, args.result)

    from tunekit.config import load_recipe
    from tunekit.config.errors import TunekitError

    by_preset = plan(args.presets, args.backend, args.device, args.extra, args.probe_steps, args.seqs)
    if args.only:
        by_preset = {p: [j for j in js if j.key in args.only] for p, js in by_preset.items()}
    jobs = [j for js in by_preset.values() for j in js]
    try:
        for j in jobs:
            load_recipe(j.preset, j.overrides)  # bad overrides are refused before anything runs
    except TunekitError as e:
        print(f"engine_knobs: {e.message}", file=sys.stderr)
        return 2
    card = card_gib(args.device, args.gpu_profile)
    from tunekit.launch.probe import pick_profile

    profile = pick_profile(args.gpu_profile, args.device == "cuda")
    if args.dry_run:
        for j in jobs:
            print(f"{j.key:24s} {j.kind:6s} estimate {fmt(estimate_gb(j, card)):>5s} GiB  "
                  f"{' '.join(o for o in j.overrides if o not in SHAPE)}")
        return 0
    if args.backend == "vllm" and args.device == "cuda":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("engine_knobs: needs vLLM (`pip install -e '.[vllm]'`) and an NVIDIA GPU; on a machine without "
                  "them, --backend hf --device cpu runs the plan as a smoke test.", file=sys.stderr)
            return 2
    from tunekit.profiler.nvml import gpu_names

    args.out.mkdir(parents=True, exist_ok=True)
    versions = {}
    for mod in ("torch", "vllm"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": (gpu_names() or ["cpu"])[0], "card_gib": card, **versions,
            "command": "PYTHONPATH=. python3 benchmarks/engine_knobs.py " + " ".join(sys.argv[1:]),
            "shape": " ".join(SHAPE + args.extra) + f"; {args.gens} timed generations per engine run, "
                     f"{args.probe_steps}-step probes",
            "base": knob_sets("base", args.backend)}
    rows: dict[str, dict] = {}
    t0 = time.monotonic()
    for i, (preset, preset_jobs) in enumerate(by_preset.items()):
        deadline = t0 + args.budget * (i + 1) / len(by_preset)  # this preset's share; what one leaves carries over
        for j in preset_jobs:
            if j.kind == "probe" and deadline - time.monotonic() > MIN_PROBE_S:
                print(f"[{time.monotonic() - t0:5.0f}s] {j.key}", flush=True)
                rows[j.key] = {"kind": "probe", **probe_job(j, args.out, deadline - time.monotonic())}
        engine = [j for j in preset_jobs if j.kind == "engine"]
        if engine and deadline - time.monotonic() > MIN_START_S:
            print(f"[{time.monotonic() - t0:5.0f}s] {preset}: {len(engine)} engine runs", flush=True)
            for key, row in engine_jobs(engine, args.gens, card, deadline, args.out).items():
                rows[key] = {"kind": "engine", **row}
        for j in preset_jobs:
            rows.setdefault(j.key, {"kind": j.kind, "status": "skipped",
                                    "reason": f"the preset's share of the {args.budget:g} s budget was spent"})
            rows[j.key]["overrides"] = [o for o in j.overrides if o not in SHAPE]
            if j.kind == "engine":
                rows[j.key]["model_gen_s"] = model_gen_s(j, profile)
        for j in preset_jobs:
            r = rows[j.key]
            print(f"  {j.key}: {r['status']} gen={fmt(r.get('gen_s'))}s kv={fmt(r.get('kv_usage_peak'))} "
                  f"est={fmt(r.get('est_peak_gb'))} nvml={fmt(r.get('measured_peak_gb'))} {r.get('reason', '')[:200]}",
                  flush=True)
        meta["total_s"] = time.monotonic() - t0
        write(args.out, rows, meta)
    write(args.out, rows, meta)
    print(markdown(rows, meta))
    return 0 if all(r["status"] == "ok" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
