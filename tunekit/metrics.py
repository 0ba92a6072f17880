"""The metric schema: every name a probe records, with its meaning and unit.

A probe's step rows (``steps.parquet``) and the metric keys of its ``summary.json`` (the names with a ``/``) use
these names and no others, whichever runner ran it; a runner that cannot measure a metric writes nothing for it
(never a made-up zero). The names are verl's where verl has one, so a verl user reads them as they are.

A name with a ``<part>`` stands for a family (``comm/wait_s/<phase>``: one per phase); :data:`PARTS` says what each
part may be. Readers use the constants and builders here (:data:`TIMING_STEP`, :func:`timing`), so renaming a
metric is one line; :func:`find` answers which entry a recorded name belongs to, :func:`unknown` which recorded
names belong to none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

PHASES = ("gen", "reward", "ref", "old_logprob", "values", "adv", "update_critic", "update_actor", "update_weights")
"""The phases of a training step, in their order (verl's ``marked_timer`` sections; verl's ``old_log_prob`` is
``old_logprob``): generate the responses, score them, the reference's and the old policy's logprobs, the critic's
values, the advantages, the critic's and the actor's update, the new weights into the rollout engine."""

ROLES = ("actor", "critic")

PARTS = {"phase": "|".join(PHASES), "role": "|".join(ROLES), "n": r"\d+", "gpu": r"[^/]+", "key": r"[^/]+"}
"""What each ``<part>`` of a family's name may be: a phase of :data:`PHASES`, a trained role, a node or device
number, a GPU's label (its NVML index, ``node<N>.gpu<I>`` across nodes), a key the reward function returned."""


@dataclass(frozen=True)
class Metric:
    """One recorded name (or family of names), its unit and what it measures."""

    name: str
    unit: str
    meaning: str


GIB = float(1024**3)
"""Bytes in the unit of every ``*_gb`` metric: verl divides by 1024**3 and calls it "gb"; tunekit's numbers stay
comparable with its."""

# the names readers spell most; every other one is in METRICS below
STEP = "step"
REWARD_MEAN = "reward/mean"
EVAL_REWARD_MEAN = "eval/reward_mean"
EVAL_TIME_S = "eval/time_s"
EVAL_REWARD_BEFORE = "eval/reward_before"
MACHINE = "machine/id"
"""``summary.json``'s key: :func:`tunekit.profiler.machine.machine_id` of the machine the probe ran on."""
RESPONSE_LENGTH_MEAN = "response_length/mean"
TIMING_STEP = "timing_s/step"
TOTAL_TOKENS = "perf/total_tokens"
THROUGHPUT = "perf/throughput"
MAX_ALLOCATED_GB = "perf/max_memory_allocated_gb"
MAX_RESERVED_GB = "perf/max_memory_reserved_gb"
ROLLOUT_TOKENS_PER_S = "rollout/tokens_per_s"
LOGPROB_DIFF = "rollout/logprob_abs_diff_mean"
STALENESS = "rollout/staleness_steps"
KV_USAGE_PEAK = "rollout/kv_usage_peak"
PREEMPTIONS = "rollout/preemptions"
REF_KL = "actor/ref_kl"
PROFILER_OVERHEAD_S = "profiler/overhead_s"
COMM_SAMPLED = "comm/sampled"
ENERGY_J = "nvml/energy_j"
NVML_AVAILABLE = "nvml/available"
RUNNER_VERSION = "runner/version"


def timing(phase: str) -> str:
    """``timing_s/<phase>``: seconds in a phase of the step."""
    return f"timing_s/{phase}"


def comm_wait(phase: str) -> str:
    """``comm/wait_s/<phase>``: seconds a phase waited on communication."""
    return f"comm/wait_s/{phase}"


def nvml_mem_used(gpu: str | int) -> str:
    """``nvml/mem_used_gb/<gpu>``: a GPU's peak used memory (NVML)."""
    return f"nvml/mem_used_gb/{gpu}"


def nvml_own_mem_used(gpu: str | int) -> str:
    """``nvml/own_mem_used_gb/<gpu>``: the probe's own peak on a GPU (its processes' memory NVML names, plus the
    driver's share), which other jobs on the card do not move."""
    return f"nvml/own_mem_used_gb/{gpu}"


def reward_extra(key: str) -> str:
    """``reward/extra/<key>``: the step's mean of a key a reward function returned beside its score."""
    return f"reward/extra/{key}"


METRICS: tuple[Metric, ...] = (
    # ---- the step row (steps.parquet); a summary's "steady" holds the step medians of the timing_s/, perf/, comm/ ones
    Metric(STEP, "step", "the probe step the row describes, from 0"),
    Metric(REWARD_MEAN, "reward", "mean task reward of the step's responses (before any KL penalty)"),
    Metric("reward/std", "reward", "standard deviation of the step's rewards"),
    Metric("reward/exact", "share", "share of the step's responses whose reward reached the top of "
           "task.reward_range (an exact answer, for the shipped tasks)"),
    Metric("reward/frac_zero_std", "share", "share of the step's prompts whose responses all got the same reward "
           "(no group advantage to learn from)"),
    Metric(reward_extra("<key>"), "as returned", "step mean of a key the reward function returned beside its score"),
    Metric(EVAL_REWARD_MEAN, "reward", "mean reward of greedy responses to the held-out prompts (task.eval_fraction or task.eval_dataset), "
           "on the steps probe.eval_every names"),
    Metric(EVAL_TIME_S, "s", "wall seconds of that evaluation, kept out of timing_s/step"),
    Metric(EVAL_REWARD_BEFORE, "reward", "the held-out reward before the first step (probe.eval_before_train): the "
           "untrained model's; in startup.json, result.json and summary.json"),
    Metric("eval/reward_first", "reward", "summary: the probe's first evaluation's eval/reward_mean (after training steps)"),
    Metric("eval/reward_last", "reward", "summary: the probe's last evaluation's eval/reward_mean"),
    Metric("eval/evaluations", "count", "summary: how many evaluations the probe recorded"),
    Metric(RESPONSE_LENGTH_MEAN, "tokens", "mean response length of the step"),
    Metric("actor/pg_loss", "loss", "the policy-gradient term of the actor's loss, mean over its micro-batches"),
    Metric("actor/loss", "loss", "the actor's whole loss (policy term, KL and entropy terms), mean over its "
           "micro-batches"),
    Metric("actor/pg_clipfrac", "share", "share of response tokens where the clipped PPO term won"),
    Metric("actor/pg_clipfrac_lower", "share", "share of response tokens where the dual-clip cap won (negative "
           "advantages)"),
    Metric("actor/ppo_kl", "nats", "mean of old minus new logprob over response tokens (verl's k1 estimate of "
           "KL(old || new)): how far the update moved the policy"),
    Metric("actor/entropy", "nats", "mean token entropy of the policy over the responses"),
    Metric("actor/grad_norm", "norm", "the actor's gradient norm before clipping, mean over its optimizer steps "
           "(runner trl: the last optimizer step's, as transformers logs it)"),
    Metric(REF_KL, "nats", "mean KL of the policy to the reference model over response tokens (k1)"),
    Metric("critic/vf_loss", "loss", "the critic's clipped value loss, mean over its micro-batches"),
    Metric("critic/vf_clipfrac", "share", "share of response tokens where the clipped value error was larger"),
    Metric("critic/grad_norm", "norm", "the critic's gradient norm before clipping, mean over its optimizer steps"),
    Metric(timing("<phase>"), "s", "wall seconds of a phase of the step (:data:`PHASES`), synchronised with the GPU"),
    Metric(TIMING_STEP, "s", "wall seconds of the whole step, the profiler's own time left out"),
    Metric(TOTAL_TOKENS, "tokens", "prompt and response tokens of the step, over every rank"),
    Metric(ROLLOUT_TOKENS_PER_S, "tokens/s", "the step's response tokens (every rollout rank's) per second of "
           "timing_s/gen"),
    Metric(LOGPROB_DIFF, "nats", "mean |rollout logprob - training logprob| over response tokens: the on-policy check"),
    Metric("rollout/weight_sync_bytes", "bytes", "bytes of weights sent to the rollout engine in the step"),
    Metric(STALENESS, "steps", "how many updates the rollout's weights lag the actor's"),
    Metric(KV_USAGE_PEAK, "share", "the fullest the rollout engine's KV cache was (0 to 1); in the summary, over the "
           "steady steps"),
    Metric(PREEMPTIONS, "requests", "requests the rollout engine preempted for lack of KV cache; in the summary, the "
           "steady steps' mean"),
    Metric(MAX_ALLOCATED_GB, "GiB", "peak memory the allocator handed out in the step (the fullest worker)"),
    Metric(MAX_RESERVED_GB, "GiB", "peak memory the allocator held in the step (the fullest worker)"),
    Metric("perf/max_memory_allocated_gb/<phase>", "GiB", "allocator peak during a phase"),
    Metric("perf/max_memory_reserved_gb/<phase>", "GiB", "allocator's reserved peak during a phase"),
    Metric("perf/max_memory_allocated_gb/device<n>", "GiB", "allocator peaks summed over the workers sharing a device"),
    Metric("perf/max_memory_reserved_gb/device<n>", "GiB", "reserved peaks summed over the workers sharing a device"),
    Metric("perf/gc_s", "s", "seconds the interpreter spent collecting garbage in the step"),
    Metric("perf/gc_s/<phase>", "s", "seconds of garbage collection inside a phase"),
    Metric("perf/gc_full_collections", "count", "full garbage collections in the step"),
    Metric(PROFILER_OVERHEAD_S, "s", "the profiler's own time in the step (kept out of timing_s); in the summary, "
           "the probe's total"),
    Metric(COMM_SAMPLED, "flag", "1 on a step whose communication was traced"),
    Metric(comm_wait("<phase>"), "s", "seconds a phase waited on communication (sampled steps; the mean over ranks)"),
    Metric("comm/exposed_s/<phase>", "s", "seconds of a phase's communication not hidden behind compute (the mean "
           "over ranks)"),
    Metric("comm/total_s/<phase>", "s", "seconds of a phase's communication kernels in all (the mean over ranks)"),
    Metric("comm/bytes/<phase>", "bytes", "bytes a phase's collectives moved (the mean over ranks)"),
    Metric("comm/node<n>/wait_s/<phase>", "s", "comm/wait_s/<phase>, the mean over one node's ranks"),
    Metric("comm/node<n>/exposed_s/<phase>", "s", "comm/exposed_s/<phase>, the mean over one node's ranks"),
    Metric("comm/node<n>/total_s/<phase>", "s", "comm/total_s/<phase>, the mean over one node's ranks"),
    Metric("comm/node<n>/bytes/<phase>", "bytes", "comm/bytes/<phase>, the mean over one node's ranks"),
    # ---- summary.json only
    Metric(THROUGHPUT, "tokens/s/GPU", "steady perf/total_tokens over timing_s/step, per GPU held (verl's definition)"),
    Metric("perf/mfu/<role>", "share", "model FLOPs utilisation of a role's update phase (None without a known peak)"),
    Metric("profiler/overhead_share", "share", "the profiler's own time over the probe's wall time"),
    Metric(RUNNER_VERSION, "text", "the version of the framework that ran the probe (tunekit's for builtin)"),
    Metric("resolved/<key>", "flag", "what an ``auto`` knob resolved to on this machine (fsdp, compile, "
           "master_weights, cuda_graphs)"),
    Metric("comm/method", "text", "how communication was measured, or why it was not"),
    Metric("comm/sample_steps", "steps", "the steps whose communication was traced"),
    Metric(NVML_AVAILABLE, "flag", "whether NVML sampled the probe's GPUs"),
    Metric("nvml/reason", "text", "why NVML did not sample"),
    Metric("nvml/error", "text", "what went wrong while NVML sampled"),
    Metric("nvml/source", "text", "who sampled the NVML peaks when the probe itself did not (the launcher)"),
    Metric("nvml/energy_method", "text", "how energy was read (the counter, or power integrated over time)"),
    Metric(ENERGY_J, "J", "energy the probe's GPUs used"),
    Metric("nvml/energy_j/<gpu>", "J", "energy one GPU used"),
    Metric(nvml_mem_used("<gpu>"), "GB", "peak used memory of one GPU, every process on it (NVML)"),
    Metric(nvml_own_mem_used("<gpu>"), "GB", "the probe's own peak on one GPU: its processes' memory and the driver's share, others' left out (NVML)"),
    Metric("nvml/util_mean/<gpu>", "%", "mean utilisation of one GPU"),
    Metric("nvml/node<n>/energy_j", "J", "energy one node's GPUs used"),
    Metric("nvml/node<n>/mem_used_gb", "GB", "the highest peak used memory of one node's GPUs"),
    Metric("nvml/node<n>/util_mean", "%", "mean utilisation of one node's GPUs"),
    Metric("memory/estimate_gb", "GiB", "the memory verdict's peak for the fullest GPU"),
    Metric("memory/estimate_gb/<gpu>", "GiB", "the memory verdict's peak for one GPU (device-map index)"),
    Metric("memory/card_gb", "GiB", "the card's memory (the price profile's)"),
    Metric("memory/measured_gb", "GB", "the fullest GPU's NVML peak, as the estimate counts it"),
    Metric("memory/estimate_error", "ratio", "(estimate - measured) / measured: below 0 the estimate was low"),
    Metric("cost/probe_yuan", "yuan", "what the probe cost: wall time x devices held x price"),
    Metric("cost/probe_gpu_hours", "GPU-h", "device hours the probe held"),
    Metric("cost/projected_yuan", "yuan", "the projected cost of the full run"),
    Metric("cost/projected_gpu_hours", "GPU-h", "device hours of the projected full run"),
    Metric("cost/projected_wall_s", "s", "wall seconds of the projected full run"),
    Metric("cost/yuan_per_step", "yuan", "price of one steady step"),
    Metric("cost/target_steps", "steps", "steps the full run needs (run.until's rule)"),
    Metric("cost/run_rule", "text", "the rule that set the full run's length"),
    Metric("cost/extrapolated_from_warmup", "flag", "true where the probe ran no step past probe.warmup_steps: its "
           "steps after the first stood in for steady ones"),
    Metric("startup/start_key", "text", "digest of what decides the work of the probe's cold start (model, runner, "
           "training path, engine compile knobs): a cold probe's start prices the runs of the probes that share it"),
    Metric("cost/own_overhead_s", "s", "what the probe's own run would pay once above its steps at the mean step "
           "(start-up, teardown, the warm-up steps' excess)"),
    Metric("cost/priced_overhead_s", "s", "the one-time cost the run is priced with: a cold start's (the cold probe "
           "of the same start, or run.startup_s), or the probe's own"),
    Metric("cost/overhead_source", "text", "where cost/priced_overhead_s came from"),
    Metric("machine/id", "text", "a digest of the host's name and its GPUs' UUIDs: a cold start prices only the "
           "warm probes of its own machine"),
    Metric("startup/launch_s", "s", "launch to the probe's main process starting its work (interpreter, imports, "
           "torchrun)"),
    Metric("startup/imports_s", "s", "the trainer's own imports in its main process (verl: its entry process's "
           "start, imports and Hydra config, to its Ray init)"),
    Metric("startup/setup_s", "s", "the process group, the tokenizer and the workload (verl: its task runner, "
           "tokenizer, dataloader and resource pools)"),
    Metric("startup/other_s", "s", "start-up outside its timed parts (the profiler's start, the trainer's; verl: "
           "any part whose log lines did not appear)"),
    Metric("startup/model_load_s", "s", "building or loading the models and placing the roles on their devices "
           "(verl: its worker group's processes and their actor, reference and critic FSDP models)"),
    Metric("startup/engine_start_s", "s", "starting the rollout engine (a vLLM engine or server; HF generation: none; "
           "verl: its vLLM server replicas)"),
    Metric("startup/prepare_s", "s", "a framework runner's own work before the framework starts (the checkpoint, "
           "the data files, the prompt checks)"),
    Metric("startup/ray_start_s", "s", "Ray's cluster started or joined (ray.init; verl's local one, the single "
           "controller's)"),
    Metric("startup/reward_workers_s", "s", "verl: its reward loop workers started"),
    Metric("startup/weight_sync_setup_s", "s", "verl: its checkpoint engine (the actor-to-server weight sync) built "
           "and the servers put to sleep"),
    Metric("startup/before_first_step_s", "s", "verl: from its trainer's set-up to the first step (its agent loop "
           "workers, its trackers, validation before training when on)"),
    Metric("startup/framework_init_s", "s", "a framework's trainer built (TRL's GRPOTrainer: its models loaded, a "
           "colocated engine started)"),
    Metric("startup/eval_before_s", "s", "the evaluation before the first step (probe.eval_before_train)"),
    Metric("startup/workers_start_s", "s", "single controller: starting the role workers, each loading its model"),
    Metric("first_step/step_s", "s", "the first step's wall time"),
    Metric("first_step/excess_s", "s", "the first step's wall time over the median steady step"),
    Metric("first_step/compile_s", "s", "torch.compile's time (Dynamo, AOTAutograd, Inductor) inside the first step"),
    Metric("first_step/graph_capture_s", "s", "CUDA-graph capture inside the first step"),
    Metric("compile/total_s", "s", "torch.compile's time over the whole probe, in the process that runs the loop"),
    Metric("compile/dynamo_s", "s", "Dynamo's bytecode trace and guard building over the whole probe: the part of "
           "compile no cache skips"),
    Metric("compile/backend_s", "s", "AOTAutograd and Inductor over the whole probe (their cache loads when warm)"),
    Metric("compile/graphs", "graphs", "graphs Dynamo traced over the whole probe (recompiles included)"),
    Metric("compile/graph_capture_s", "s", "CUDA-graph capture over the whole probe"),
    Metric("compile/graph_captures", "graphs", "CUDA graphs captured over the whole probe"),
    Metric("compile_cache/inductor", "text", "hit (every Inductor/AOTAutograd cache lookup answered), miss (none) or "
           "partial"),
    Metric("compile_cache/hits", "count", "Inductor and AOTAutograd cache lookups answered from the shared cache"),
    Metric("compile_cache/misses", "count", "Inductor and AOTAutograd cache lookups that compiled"),
    Metric("compile_cache/shapes", "text", "at the launch: compiled (an earlier probe compiled these shapes into the "
           "shared compile cache) or new; the cold-start word where the compiling ran outside the recording process"),
    Metric("compile_cache/failed_attempt_s", "s", "where the shared compile cache failed the probe's first attempt "
           "and it ran again cold in a private one: the first attempt's seconds (in cost/probe_yuan, not in wall_s)"),
    Metric("compile_cache/vllm", "text", "whether vLLM's own compile cache answered its engines (read off their "
           "output): hit, miss, partial or disabled; absent where no engine compiled"),
    Metric("compile_cache/vllm_hits", "count", "vLLM graphs (or compiled forwards) loaded from its cache"),
    Metric("compile_cache/vllm_misses", "count", "vLLM graphs compiled for want of a cache entry"),
    Metric("compile_cache/dir", "text", "shared (and a corrupt module it removed), or cold with the reason the shared "
           "compile cache could not be used"),
    Metric("compile_cache/compile_threads", "text", "Inductor's compile threads: 1 where an earlier probe of the output "
           "directory compiled the same shapes into its cache (its graphs are loads), else default or the user's value"),
)


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], Metric], ...]:
    def regex(name: str) -> re.Pattern[str]:
        parts = re.split(r"<(\w+)>", name)  # literal, part, literal, part, ...
        return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?:{PARTS[p]})" for i, p in enumerate(parts)))
    return tuple((regex(m.name), m) for m in METRICS)


def find(name: str) -> Metric | None:
    """The schema's entry for a recorded name (a family's for one of its members), None for a name not in it."""
    return next((m for pattern, m in _patterns() if pattern.fullmatch(name)), None)


def unknown(names: Iterable[str]) -> list[str]:
    """The names in ``names`` the schema does not hold, in order."""
    return [n for n in names if find(n) is None]


def timed_steps(sampled: list[bool]) -> list[bool]:
    """Which steady steps' times describe a training run (``sampled``: each step's :data:`COMM_SAMPLED`): those not
    sampled for communication (the profiler's trace slows the steps it watches; a training run is not profiled), or
    every one if all were sampled."""
    return [True] * len(sampled) if all(sampled) else [not s for s in sampled]


def reward_curve(steps, metric: str = REWARD_MEAN) -> list[float]:
    """The per-step reward a verdict, a threshold and a run length read (``search.reward_metric``): ``metric``'s
    column of a probe's steps (a DataFrame), each step holding the latest value recorded at or before it (an
    evaluation is recorded every ``probe.eval_every`` steps; NaN before the first); empty without the column."""
    if metric not in steps:
        return []
    return [float(v) for v in steps[metric].ffill()]


def last_window(curve: list[float], window: int) -> list[float]:
    """The last ``window`` steps of a :func:`reward_curve`, those without a value yet left out."""
    return [v for v in curve[-window:] if v == v]


def window_values(steps, metric: str, window: int) -> list[float]:
    """The values a reward window holds, as the verdict reads them (``search.reward_metric``, ``reward_window``): the
    last ``window`` steps of ``metric``, or, for :data:`EVAL_REWARD_MEAN`, the evaluations recorded in them (the latest
    before them where none is): one value an evaluation, not the steps that repeat it."""
    if metric != EVAL_REWARD_MEAN:
        return last_window(reward_curve(steps, metric), window)
    if metric not in steps:
        return []
    column = steps[metric]
    inside = [float(v) for v in column.iloc[-window:].dropna()]
    before = column.iloc[:-window].dropna()
    return inside or ([float(before.iloc[-1])] if len(before) else [])


def reading_words(metric: str, window: int) -> str:
    """What a verdict's reward is, in words: the training batch's mean over the window, or the held-out one."""
    if metric == EVAL_REWARD_MEAN:
        return (f"held-out reward: greedy answers to the held-out prompts, the evaluations in the last {window} steps, "
                "Wilson's interval over the prompts")
    return f"mean reward of the last {window} steps"


def summary_metrics(summary: dict) -> list[str]:
    """The metric keys of a ``summary.json`` (its slash names, and its steady medians'); the others (``status``,
    ``runner``, ``wall_s``, ...) are the run directory's fields (:mod:`tunekit.rundir`)."""
    return [k for k in summary if "/" in k] + list(summary.get("steady") or {})
