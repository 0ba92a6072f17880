"""Run one probe in its own process tree and record what happened.

A probe is a fresh session running the recipe's runner (:mod:`tunekit.runners`) with
a timeout; an OOM, a crash or a hang in any rank becomes ``status`` in
summary.json and the whole tree is killed, so a search can go on.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tunekit import metrics, rundir
from tunekit.estimate import cold_start, cost, memory
from tunekit.config import ProbeConfig, Recipe
from tunekit.placement.gpus import nvml_indices, on_gpu
from tunekit.launch.failure import outcome
from tunekit.launch.output import copy_output
from tunekit.launch.preflight import preflight
from tunekit.launch.procs import kill_leftover_servers, kill_tree
from tunekit.workload.models import matmul_shape
from tunekit.workload.pretrained import resolve_model
from tunekit.metrics import MACHINE
from tunekit.profiler.machine import machine_id
from tunekit.profiler.mfu import update_mfu
from tunekit.profiler.nvml import NvmlSampler, launcher_peaks
from tunekit.profiler.phases import steady_from_steps
from tunekit.profiler.startup import launch_stamp, vllm_cache_fields
from tunekit.estimate.profiles import PriceProfile, load_profile, match_profile
from tunekit.estimate.step_times import profiler_seconds
from tunekit.runners import runner_for
from tunekit.runners.base import (CACHE_STATE_ENV, COMPILE_THREADS_ENV, COMPILED_MARK_ENV, cache_broke, mark_compiled,
                                  private_cache_env, remove_private_cache)

Progress = Callable[[int], None]
LOG_DRAIN_S = 5.0  # how long the launcher waits for the last lines of a finished probe's output


@dataclass
class ProbeResult:
    run_dir: Path
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        return self.summary["status"]


def pick_profile(name: str | None, on_gpu: bool) -> PriceProfile | None:
    """The named profile, else the one matching the GPU NVML reports, else cpu; None when unknown."""
    if name:
        return load_profile(name)
    if not on_gpu:
        return load_profile("cpu")
    from tunekit.profiler.nvml import gpu_names

    names = gpu_names()
    return match_profile(names[0]) if names else None


def _wait(proc: subprocess.Popen, run_dir: Path, probe: ProbeConfig, progress: Progress | None) -> str | None:
    """Wait for the process; the timeout's reason when one passed (the tree is then killed), else None.

    Besides ``probe.timeout_s``, ``probe.stall_timeout_s`` ends a probe that started
    stepping and then finished no step for that long (a hang), however slow its startup was.
    """
    start = time.monotonic()
    last_done, last_change = 0, start
    while proc.poll() is None:
        now, done = time.monotonic(), rundir.steps_done(run_dir)
        if done != last_done:
            last_done, last_change = done, now
        reason = None
        if now - start > probe.timeout_s:
            reason = "probe passed its timeout (probe.timeout_s) and was killed"
        elif probe.stall_timeout_s and 0 < done < probe.steps and now - last_change > probe.stall_timeout_s:
            reason = f"no step finished for {probe.stall_timeout_s:g} s after step {done - 1} (probe.stall_timeout_s): a hang; killed"
        if reason:
            kill_tree(proc)
            return reason
        if progress is not None:
            progress(done)
        time.sleep(0.2)
    kill_tree(proc)  # stray children (a rank that outlived torchrun, a Ray worker)
    if progress is not None:
        progress(rundir.steps_done(run_dir))
    return None


def summarize(recipe: Recipe, run_dir: Path, status: str, reason: str, wall_s: float, profile: PriceProfile | None,
              launcher: dict | None = None, machine: str | None = None) -> dict:
    """The probe's summary.json; ``launcher``: the launcher's own NVML summary, whose peaks stand in where the probe
    wrote none; ``machine``: the launch's :func:`~tunekit.profiler.machine.machine_id` (read again when not given)."""
    steps = rundir.read_steps(run_dir)
    result = rundir.read_result(run_dir) or stopped_result(recipe, run_dir, steps)
    rewards = steps[metrics.REWARD_MEAN].tolist() if metrics.REWARD_MEAN in steps else []
    held = recipe.system.world_size  # the devices the probe is priced for: GPUs, or CPU ranks on CPU
    gpus = held if on_gpu(recipe.system.device, torch.cuda.device_count()) else 0
    summary: dict[str, Any] = {
        "status": status, "reason": reason, "recipe": recipe.name, "runner": recipe.runner, "steps": len(rewards),
        "steps_planned": recipe.probe.steps, "wall_s": wall_s, "gpus_held": gpus, "devices_held": held,
        "reward_first10": sum(rewards[:10]) / len(rewards[:10]) if rewards else None,
        "reward_last10": sum(rewards[-10:]) / len(rewards[-10:]) if rewards else None,
        "profile": profile.name if profile else "unknown",
    }
    if metrics.EVAL_REWARD_MEAN in steps and steps[metrics.EVAL_REWARD_MEAN].notna().any():
        held_out = steps[metrics.EVAL_REWARD_MEAN].dropna()  # every probe.eval_every steps
        summary |= {"eval/reward_first": float(held_out.iloc[0]), "eval/reward_last": float(held_out.iloc[-1]),
                    "eval/evaluations": len(held_out)}
    path = runner_for(recipe).training_path(recipe, gpu=bool(gpus))  # what the ``auto`` knobs resolved to
    summary |= path
    summary[cold_start.START_KEY] = cold_start.start_key(recipe, path)  # as probe_start_key gave it at the launch
    summary[MACHINE] = machine or machine_id()
    summary |= result
    summary |= perf_metrics(recipe, result.get("steady", {}), held, profile if gpus else None)
    summary |= memory.kv_cache_fields(steps, recipe.probe.warmup_steps)
    summary |= vllm_cache_fields(rundir.read_all_output(run_dir))
    if gpus and launcher:
        summary |= launcher_peaks(summary, launcher)
    if gpus:  # the estimate beside the measured peak (NVML's, nvml/mem_used_gb/<gpu>) and its error
        card = profile.memory_gib if profile is not None else None
        summary |= memory.summary_fields(memory.estimate_memory(recipe, memory.model_shape(recipe), card,
                                                                traits=runner_for(recipe).traits))
        summary |= memory.error_fields(summary)
    if metrics.PROFILER_OVERHEAD_S in steps:  # the profiler's own time, kept out of the step times
        own = profiler_seconds(steps)
        summary |= {metrics.PROFILER_OVERHEAD_S: own, "profiler/overhead_share": own / wall_s if wall_s > 0 else None}
    if profile is not None:
        spend = cost.probe_spend(wall_s, held, profile)
        summary |= {"cost/probe_yuan": spend.yuan, "cost/probe_gpu_hours": spend.gpu_hours}
        run = cost.recipe_run_length(recipe, metrics.reward_curve(steps, recipe.search.reward_metric))
        if len(steps) and metrics.TIMING_STEP in steps:
            # projected over the run's steps, or over the steps it ran where the run's length is unknown: its own
            # one-time cost is what a cold probe lends the other probes of its start (tunekit.estimate.cold_start)
            target = run.steps if run.steps is not None else len(steps)
            project = functools.partial(cost.project_probe, steps, wall_s=wall_s, startup_s=result.get("startup_s", 0.0),
                                        warmup_steps=recipe.probe.warmup_steps, target_steps=target,
                                        gpus_held=held, profile=profile, eval_every=recipe.probe.eval_every)
            proj = project()
            own_s = summary[cold_start.OWN] = cost.one_time_s(proj, target)
            if len(rewards) and run.steps is not None:
                # the run starts cold once, whatever this probe found warm
                priced, source = cold_start.priced_overhead(recipe, run_dir, summary[cold_start.START_KEY], own_s,
                                                            summary[MACHINE])
                proj = project(overhead_s=priced) if priced != own_s else proj
                summary |= {cold_start.PRICED: priced, cold_start.SOURCE: source,
                            "cost/projected_yuan": proj.yuan, "cost/projected_gpu_hours": proj.gpu_hours,
                            "cost/projected_wall_s": proj.wall_s,
                            "cost/yuan_per_step": cost.yuan_per_step(proj.mean_step_s, held, profile),
                            "cost/target_steps": run.steps}
                if proj.extrapolated_from_warmup:
                    summary["cost/extrapolated_from_warmup"] = True
        summary["cost/run_rule"] = run.rule
    return summary


def probe_start_key(recipe: Recipe, *, gpu: bool) -> str:
    """The start key (:func:`tunekit.estimate.cold_start.start_key`) of a probe of ``recipe``, on a GPU or not: known
    before the launch from the runner's training path, so the running probe's summary carries it too."""
    return cold_start.start_key(recipe, runner_for(recipe).training_path(recipe, gpu=gpu))


def stopped_result(recipe: Recipe, run_dir: Path, steps) -> dict:
    """For a probe stopped before writing its result (killed at its limit, crashed): its start-up as its first step
    left it (startup.json, :func:`tunekit.rundir.read_startup`) and the steady medians of the steps it finished past
    the warm-up, as the trainer would have written them, with the first step's excess over them; empty without
    either."""
    started = rundir.read_startup(run_dir) or {}
    warm = recipe.probe.warmup_steps
    if len(steps) <= warm or metrics.TIMING_STEP not in steps:
        return started
    steady = steady_from_steps(steps, warm)
    excess = ({"first_step/excess_s": started["first_step/step_s"] - steady[metrics.TIMING_STEP]}
              if "first_step/step_s" in started and metrics.TIMING_STEP in steady else {})
    return started | {"steady": steady, "steady_from_step": warm} | excess


def perf_metrics(recipe: Recipe, steady: dict, held: int, profile: PriceProfile | None) -> dict[str, float | None]:
    """``perf/throughput`` (tokens/s per GPU held, as verl defines it) and the update phases' MFU.

    MFU needs the GPU's dense bf16 peak from the price profile; without one (unknown GPU, CPU: a probe on CPU gets
    no profile here, even where a GPU's profile prices it) it is None.
    """
    tokens, step_s = steady.get(metrics.TOTAL_TOKENS), steady.get(metrics.TIMING_STEP)
    if not tokens or not step_s:
        return {}
    out: dict[str, float | None] = {metrics.THROUGHPUT: tokens / step_s / held}
    peak = profile.peak_bf16_tflops if profile is not None else None
    timed = [role for role in ("actor", "critic") if steady.get(f"timing_s/update_{role}")]
    if peak is None:  # MFU is unknown without a peak: the model's shape (transformers' model code) is not needed
        return out | {f"perf/mfu/{role}": None for role in timed}
    m = recipe.model
    shape = matmul_shape(m.path, m.preset, m.trust_remote_code)
    vocab = shape.pop("vocab")
    rows = recipe.system.batch.prompts_per_step * recipe.system.batch.samples_per_prompt
    head = vocab * shape["hidden"]
    response_len = steady.get(metrics.RESPONSE_LENGTH_MEAN)  # the actor's LM head runs on the response tokens only
    response_tokens = response_len * rows if response_len else None
    for role in timed:
        actor = role == "actor"
        n = shape["n_params"] - (0 if actor else head)  # the critic: value head, no LM head
        out[f"perf/mfu/{role}"] = update_mfu(
            tokens=tokens, seq_len=tokens / rows, epochs=recipe.algorithm.ppo_epochs,
            seconds=steady[f"timing_s/update_{role}"], gpus=len(recipe.system.device_map.get(role, [])) or 1,
            peak_tflops=peak, head_params=head if actor else 0, head_tokens=response_tokens if actor else None,
            **(shape | {"n_params": n}))
    return out


@dataclass(frozen=True)
class Plan:
    """A recipe that passed preflight on this machine, with what launching it needs to know."""

    recipe: Recipe
    on_gpu: bool
    profile: PriceProfile | None


def check_probe(recipe: Recipe, *, gpu_profile: str | None = None) -> Plan:
    """Preflight ``recipe`` here and pick its price profile; bad input raises TunekitError, nothing is written. A
    pretrained preset or a ``.gguf`` model is converted first, and the plan's recipe names its checkpoint."""
    recipe = resolve_model(recipe)
    cuda_count = torch.cuda.device_count()
    preflight(recipe, cuda_count)
    gpu = on_gpu(recipe.system.device, cuda_count)
    profile = pick_profile(gpu_profile, gpu)
    # the graphs the memory estimate leaves out on the card: the probe runs what was estimated, its summary's
    # resolved/cuda_graphs says so
    card = profile.memory_gib if profile else None
    return Plan(memory.graphs_for_card(recipe, card, traits=runner_for(recipe).traits) if gpu else recipe, gpu, profile)


def fit_warning(plan: Plan) -> str | None:
    """One sentence when the memory estimate says a GPU probe cannot fit on its card, else None. The probe runs all
    the same: the estimate can be wrong, and running out of memory is an outcome the probe records."""
    if not plan.on_gpu or plan.profile is None:
        return None
    why = memory.would_not_fit(plan.recipe, plan.profile.memory_gib, traits=runner_for(plan.recipe).traits)
    return None if why is None else f"{plan.recipe.name} on {plan.profile.name}: {why}; the probe runs anyway"


def run_probe(recipe: Recipe, *, out: str | Path | None = None, gpu_profile: str | None = None,
              progress: Progress | None = None, run_id: str | None = None) -> ProbeResult:
    """Check, launch, wait, record. Bad input raises TunekitError before anything is written."""
    return launch_probe(check_probe(recipe, gpu_profile=gpu_profile), out=out, progress=progress, run_id=run_id)


def launch_probe(plan: Plan, *, out: str | Path | None = None, progress: Progress | None = None,
                 run_id: str | None = None) -> ProbeResult:
    """Launch a checked probe (:func:`check_probe`), wait for it, record its outcome in summary.json."""
    recipe, profile = plan.recipe, plan.profile
    run_dir = Path(out or recipe.probe.out) / (run_id or rundir.new_run_id(recipe.name))
    run_dir.mkdir(parents=True, exist_ok=False)
    rundir.write_config(run_dir, recipe)
    # the start key from the first: a probe stopped before its end still lends its cold start (cold_start)
    machine = machine_id()
    runner = runner_for(recipe)
    env = runner.env(recipe, run_dir, on_gpu=plan.on_gpu)
    # whether an earlier probe compiled these shapes into the shared cache: the word on a cold start where the
    # compiling runs outside the process that records the probe (cold_start.cache_reading)
    shapes = {cold_start.SHAPES: "compiled" if Path(env[COMPILED_MARK_ENV]).exists() else "new"} \
        if COMPILED_MARK_ENV in env else {}
    rundir.write_summary(run_dir, {"status": "running", "recipe": recipe.name, MACHINE: machine,
                                   cold_start.START_KEY: probe_start_key(recipe, gpu=plan.on_gpu)} | shapes)
    t0 = time.monotonic()
    status, reason, watch = _attempt(plan, runner, run_dir, env, progress)
    first_s = None
    if status == "failed" and cache_broke(reason, env):  # the shared cache failed it: once more, cold in a private one
        first_s = time.monotonic() - t0
        env = private_cache_env(env, f"the shared compile cache failed the probe's first attempt ({reason[:200]}); "
                                     "it ran again compiling into a private directory") | launch_stamp()  # its own start-up
        rundir.set_attempt_aside(run_dir)
        t0 = time.monotonic()
        status, reason, watch = _attempt(plan, runner, run_dir, env, progress)
    wall_s = time.monotonic() - t0
    summary = summarize(recipe, run_dir, status, reason, wall_s, profile, launcher=watch.summary() if watch else None,
                        machine=machine) | shapes
    if first_s is not None:  # the failed attempt's spend is the probe's too
        summary["compile_cache/failed_attempt_s"] = first_s
        if profile is not None:
            summary["cost/probe_yuan"] = (summary.get("cost/probe_yuan", 0.0)
                                          + cost.probe_spend(first_s, summary.get("devices_held", 0), profile).yuan)
    if CACHE_STATE_ENV in env:  # whether the probe could share its output directory's compile cache, and if not why
        summary["compile_cache/dir"] = env[CACHE_STATE_ENV]
    if COMPILED_MARK_ENV in env:
        summary["compile_cache/compile_threads"] = env.get(COMPILE_THREADS_ENV, "default")
        if rundir.steps_done(run_dir) > 0:
            mark_compiled(env)
    rundir.write_summary(run_dir, summary)
    return ProbeResult(run_dir, summary)


def _attempt(plan: Plan, runner, run_dir: Path, env: dict[str, str], progress: Progress | None):
    """Run the probe's process tree in ``env`` to its end (or its limit): ``(status, reason, launcher's NVML
    sampler)``. Interrupted, it leaves no process, no private compile cache and, before a step, no run directory."""
    recipe = plan.recipe
    proc = subprocess.Popen(runner.command(recipe, run_dir), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    log = copy_output(proc.stdout, rundir.log_path(run_dir))
    watch = _launcher_nvml(recipe, proc.pid) if plan.on_gpu else None
    try:
        with watch or contextlib.nullcontext():
            timed_out = _wait(proc, run_dir, recipe.probe, progress)
    except BaseException:
        kill_tree(proc)
        kill_leftover_servers(run_dir)
        log.join(timeout=LOG_DRAIN_S)
        shutil.rmtree(run_dir, ignore_errors=True) if rundir.steps_done(run_dir) == 0 else None
        remove_private_cache(env)
        raise
    kill_leftover_servers(run_dir)  # a vLLM server runs in its own process group
    log.join(timeout=LOG_DRAIN_S)
    remove_private_cache(env)
    return (*outcome(run_dir, proc.returncode, timed_out, recipe.probe.steps), watch)


def _launcher_nvml(recipe: Recipe, root: int):
    """NVML sampled from the launcher over the probe's whole life (the process tree under ``root``): the memory peak
    of a probe that ends without its own record (killed at its limit, out of memory, crashed)."""
    return NvmlSampler(nvml_indices(recipe.system.devices), interval_s=recipe.profiler.nvml_interval_s, root=root)
