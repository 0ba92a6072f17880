"""The recipe: pydantic models that are the one home of every default.

A recipe YAML only overrides these defaults; unknown keys and wrong types are
errors that name the file and the key. ``--set dotted.key=value`` overrides are
applied to the raw mapping before validation, so they are checked the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tunekit.datadirs import data_dir
from tunekit.errors import ConfigError

RECIPES_DIR = data_dir("recipes")
ROLES = ("actor", "critic", "ref", "rollout", "reward")
PROMPT_TOKEN_BUDGET = 512
"""Tokens a prompt may take in a vLLM engine's context: its context length is this plus ``task.max_new_tokens``
(within the model's positions)."""
RunnerName = Literal["builtin", "trl", "verl"]
"""The runners a recipe may name: the keys of ``tunekit.runners.RUNNERS``."""


Effect = Literal["learning", "systems", "probe"]
"""What a key changes: ``learning`` (what the model learns: the reward curve), ``systems`` (only memory,
speed and cost: a probe must learn alike under any value), ``probe`` (only the measurement or the search,
not a training step). A section declares it for its fields (``effect``); a field that differs says so with
``Field(json_schema_extra=LEARNING)`` (or ``SYSTEMS``)."""
LEARNING: dict[str, Any] = {"effect": "learning"}
SYSTEMS: dict[str, Any] = {"effect": "systems"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    effect: ClassVar[Effect]


class ModelConfig(Strict):
    """Which policy to train. Neither ``path`` nor ``preset``: the embedded tiny checkpoint."""

    effect: ClassVar[Effect] = "learning"

    path: str | None = None
    """Local Hugging Face checkpoint directory (no hub access)."""
    preset: str | None = None
    """Architecture preset with random init (see ``tunekit.models.PRESETS``); cost depends on shapes."""
    tokenizer_path: str | None = None
    """Tokenizer directory; default: the checkpoint's, or the embedded one for presets."""
    trust_remote_code: bool = False
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """``auto``: bfloat16 on GPU, float32 on CPU."""
    reward_model_path: str | None = None
    """Sequence-classification reward model; default is the task's rule-based reward."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.path and self.preset:
            raise ValueError("set either model.path or model.preset, not both")
        return self


class TaskConfig(Strict):
    """The workload: where prompts come from, the reward that scores a response, and how responses are sampled.

    Default: the embedded arithmetic pair (generated prompts such as ``12+7=``, partial-credit reward).
    """

    effect: ClassVar[Effect] = "learning"

    dataset: str | None = None
    """Local JSONL or Parquet file, one prompt per row; default: arithmetic prompts generated from the seed."""
    prompt_column: str = "prompt"
    """The dataset's column fed to the model."""
    answer_column: str = "answer"
    """The dataset's column handed to the reward as the answer."""
    prompt_template: str | None = None
    """Python format string over the row's columns, e.g. ``"Question: {prompt}\\nAnswer:"``; default: the prompt as is."""
    reward: str = "tunekit.workload.arithmetic:reward"
    """``module:function`` scoring a response: ``function(prompt, response, answer) -> float`` (verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` works too), imported from the Python
    path with the working directory first."""
    max_operand: int = Field(20, gt=0)
    """Largest operand of the generated arithmetic prompts (no dataset only)."""
    max_new_tokens: int = Field(4, gt=0)
    fixed_length: bool = False
    """Ignore EOS and always generate ``max_new_tokens`` (GPU cost probes)."""
    temperature: float = Field(1.0, gt=0)
    reward_range: tuple[float, float] = (0.0, 1.0)
    """Lowest and highest reward the task's reward can give (the embedded arithmetic reward: 0 to 1); a
    search's threshold must lie inside it."""


class AlgorithmConfig(Strict):
    """PPO (actor + critic + ref, GAE) or GRPO (group baseline, no critic). Every key changes learning; the
    loss keys mean what verl's actor keys of the same name mean."""

    effect: ClassVar[Effect] = "learning"

    name: Literal["ppo", "grpo"] = "ppo"
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    clip_ratio: float = Field(0.2, gt=0)
    """PPO's clip range: the ratio new/old policy is clipped to [1 - clip_ratio, 1 + clip_ratio]."""
    clip_ratio_low: float | None = Field(None, gt=0)
    """Lower clip range (1 - clip_ratio_low); default ``clip_ratio``."""
    clip_ratio_high: float | None = Field(None, gt=0)
    """Upper clip range (1 + clip_ratio_high); default ``clip_ratio``. Larger than the lower one is DAPO's
    clip-higher: low-probability tokens with a positive advantage can grow further."""
    clip_ratio_c: float = Field(3.0, gt=1)
    """Dual-clip: for a negative advantage the loss of a token is capped at -A * clip_ratio_c, so a ratio
    that ran far up cannot dominate an update (verl's default 3.0)."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How the actor's per-token loss (policy, entropy and KL terms) becomes one number, over the whole
    mini-batch: ``token-mean`` every token alike (longer responses weigh more); ``seq-mean-token-mean`` each
    response alike (GRPO's paper); ``seq-mean-token-sum-norm`` token sums over the maximum response length
    ``task.max_new_tokens``, averaged over responses (Dr. GRPO). The critic's loss is a token mean."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: the actor's loss subtracts entropy_coef x the policy's entropy (at the sampling
    temperature); 0 computes no entropy at all."""
    value_clip: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL to the reference policy; 0 (the default) builds and runs no reference model at all."""
    kl_loss: bool | None = None
    """Where the KL acts: true, a term kl_coef x KL in the actor's loss (verl's ``use_kl_loss``); false, a
    penalty -kl_coef x KL on every token's reward before the advantages (PPO's way, verl's
    ``use_kl_in_reward``; for GRPO the penalised score is what the group baseline compares). Default: the
    loss term for GRPO, the reward for PPO."""
    kl_estimator: Literal["k1", "k3", "abs", "mse"] | None = None
    """Per-token KL estimate (``tunekit.trainer.algos.kl_penalty``): k1 (verl's ``kl``), k3 (``low_var_kl``,
    clamped as verl clamps it), abs, mse (``k2``). Default: k3 in the loss, k1 in the reward (verl's
    defaults for each place)."""
    ppo_epochs: int = Field(1, gt=0)
    actor_lr: float = Field(5e-4, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    whiten_advantages: bool = True
    max_grad_norm: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _kl_needs_a_coef(self) -> "AlgorithmConfig":
        if self.kl_coef == 0:
            for key in ("kl_loss", "kl_estimator"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} has no effect while kl_coef is 0 (set kl_coef > 0 or remove {key})")
        return self

    @property
    def uses_critic(self) -> bool:
        return self.name == "ppo"

    @property
    def uses_ref(self) -> bool:
        """The reference only feeds the KL: without one it is neither built nor run (as verl does)."""
        return self.kl_coef > 0

    @property
    def kl_in_loss(self) -> bool:
        """The KL is a term of the actor's loss (otherwise, with a reference, a penalty in the reward)."""
        return self.uses_ref and (self.kl_loss if self.kl_loss is not None else self.name == "grpo")

    @property
    def kl_in_reward(self) -> bool:
        return self.uses_ref and not self.kl_in_loss

    @property
    def kl_kind(self) -> str:
        """The KL estimator in effect."""
        return self.kl_estimator or ("k3" if self.kl_in_loss else "k1")

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class BatchConfig(Strict):
    """Global batch (changes learning) and micro-batch (only memory/speed)."""

    effect: ClassVar[Effect] = "systems"
    prompts_per_step: int = Field(32, gt=0, json_schema_extra=LEARNING)
    samples_per_prompt: int = Field(1, gt=0, json_schema_extra=LEARNING)
    mini_batch_size: int | None = Field(None, gt=0, json_schema_extra=LEARNING)
    """Samples per optimizer step; default: the whole step's batch (one update per epoch)."""
    micro_batch_size: int = Field(16, gt=0)
    """Samples per forward/backward; gradients accumulate over a mini-batch."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def mini_batch(self) -> int:
        return self.mini_batch_size or self.samples_per_step

    @property
    def micro_batch(self) -> int:
        """Micro-batch in effect: never larger than the mini-batch."""
        return min(self.micro_batch_size, self.mini_batch)


class RolloutConfig(Strict):
    effect: ClassVar[Effect] = "systems"
    backend: Literal["hf", "vllm", "vllm_server"] = "hf"
    """hf: ``generate`` on the actor; vllm: an in-process engine; vllm_server: a vLLM server over HTTP."""
    gpu_memory_utilization: float = 0.5
    """Fraction of each rollout GPU's memory vLLM may take (weights + KV cache)."""
    enable_sleep: bool = True
    """Sleep/wake the vLLM engine around training phases when colocated."""
    sleep_level: Literal[1, 2] = 2
    """In-process engine: 2 drops its weights while asleep (the actor's are synced into it after every wake, as
    TRL does); 1 parks them in pinned host memory and copies them back first. A server tunekit starts on the
    trainer's GPU always sleeps at level 1: no weights reach it there."""
    enforce_eager: bool = True
    """Run vLLM without CUDA graphs: starts in seconds; graphs speed up decoding of small batches."""
    torch_compile: bool = False
    """With CUDA graphs (``enforce_eager: false``): vLLM's torch.compile + piecewise graphs (slow start);
    false captures full graphs of the decode steps only, with no compilation (starts in seconds)."""
    max_num_seqs: int | None = Field(None, gt=0)
    """vLLM's ``max_num_seqs``: most sequences the engine schedules at once (one forward pass); more waits.
    Default: vLLM's own. Bounds decode batch size, so it trades KV-cache room for concurrency."""
    max_num_batched_tokens: int | None = Field(None, gt=0)
    """vLLM's ``max_num_batched_tokens``: most tokens one engine step processes (prefill chunks plus decodes).
    Default: vLLM's own. Without chunked prefill it must hold the longest sequence (prompt budget plus
    ``task.max_new_tokens``) and at least ``max_num_seqs``."""
    enable_prefix_caching: bool | None = None
    """vLLM's ``enable_prefix_caching``: reuse the KV cache of a shared prompt prefix (GRPO's samples of one
    prompt share the whole prompt). Default: vLLM's own (on in its V1 engine)."""
    enable_chunked_prefill: bool | None = None
    """vLLM's ``enable_chunked_prefill``: split long prefills across steps to batch them with decodes.
    Default: vLLM's own."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs one rollout engine spans (vLLM tensor parallel); the rollout GPUs (``system.device_map.rollout``) form
    replicas of this many consecutive GPUs each, which split the step's prompts: rollout GPUs = replicas x
    tensor_parallel_size. Larger: fewer replicas, each holding 1/TP of the weights and a KV cache TP times as large
    per sequence, at the price of an all-reduce per layer. vLLM backends only; the model's attention heads must split
    evenly over it."""
    server_url: str | None = None
    """An existing vLLM server (``http://host:port``); default: tunekit starts one on the rollout GPUs."""
    server_timeout_s: float = Field(300.0, gt=0)
    """How long to wait for a server tunekit starts to answer ``/health``."""

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util_range(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError("must be in (0, 1], e.g. 0.5")
        return v

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
        return v.rstrip("/") if v else v


class MemoryConfig(Strict):
    """Pure systems knobs: they must not change what is learned."""

    effect: ClassVar[Effect] = "systems"

    reshard_after_forward: bool = True
    param_offload: bool = False
    """Keep the sharded parameters, their gradients and the optimizer state in host memory (FSDP2's
    ``CPUOffloadPolicy``; the optimizer steps on the CPU): the least GPU memory, the slowest update."""
    gradient_checkpointing: bool = False
    fsdp_single_gpu: bool | Literal["auto"] = "auto"
    """A role on one GPU: ``true`` runs it under FSDP2 anyway (bf16 mixed precision), as verl does; ``false`` runs the
    plain module under bf16 autocast, as TRL runs one GPU: no all-gather, reduce-scatter and casts around every
    block. ``auto``: the plain module, unless parameter offload asks for FSDP2 (only FSDP2 offloads). Measured on
    the H200: the update at 0.5B, micro-batch 16, 1.75x as fast without FSDP2 (benchmarks/README.md,
    "Update-phase MFU"). Several GPUs for a role always shard; one CPU rank never does (:meth:`shards`)."""

    def shards(self, *, gpu: bool, world: int) -> bool:
        """Whether a role on ``world`` ranks runs under FSDP2: on several ranks, with parameter offload, or on one
        GPU when ``fsdp_single_gpu`` is ``true``; otherwise it is the plain module."""
        return world > 1 or self.param_offload or (gpu and self.fsdp_single_gpu is True)


class SystemConfig(Strict):
    effect: ClassVar[Effect] = "systems"
    controller: Literal["spmd", "single"] = "spmd"
    """spmd: every rank runs the loop (torchrun); single: a driver and role workers on Ray."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the training-side models: under FSDP2 each decoder block (as torchtitan does, inside FSDP's
    hooks), a plain module whole; and the log-probability of the response tokens (fused over the vocabulary).
    Fewer, fused kernels and far fewer Python calls; a slower first step (each pass of each role compiles there
    once, with the sequence length dynamic, whatever the later batches' lengths; a search's probes share
    Inductor's cache, so only the first pays the cold compile). ``auto``: compiled where a role is the plain module on a GPU (one
    GPU, no offload: measured 1.8x as fast a step at 0.5B on the H200), not on CPU and not under FSDP2
    (:meth:`compiles`). A pure systems knob like those of ``memory``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    device_map: dict[str, list[int]] = Field(default_factory=lambda: {r: [0] for r in ROLES})
    """GPUs (or CPU ranks) per role; roles sharing indices are colocated."""
    ray_address: str | None = None
    """controller single: an existing Ray cluster (``host:port`` of its head, or ``auto``); default: a fresh
    local cluster per probe, which dies with it."""
    ray_timeout_s: float = Field(60.0, gt=0)
    """controller single: how long to wait for the Ray cluster to answer and to place the workers."""
    nnodes: int = Field(1, ge=1)
    """Nodes (machines) the probe's ranks span. The devices of ``device_map`` split over them in order, the same
    number on each: node 0 holds the first ``len(devices) / nnodes``, node 1 the next, and so on (the trainer's
    GPUs under spmd, every role's under single). More than one node needs ``simulate_nodes`` (a probe launches on
    one host); on real machines run ``python -m tunekit.nodes RUN_DIR --node-rank N`` on each node N (it prints
    and runs that node's torchrun command), or start a Ray cluster whose node N has the resource ``nodeN`` and
    set ``ray_address``."""
    simulate_nodes: bool = False
    """Run every node on this host: spmd launches one torchrun per node (``--nnodes``, ``--node-rank``) meeting
    at ``master_addr:master_port``, each node seeing only its own GPUs; single starts a Ray head and one Ray node
    per further node here, each with its own GPUs and a ``nodeN`` resource, and stops them with the probe."""
    simulate_network: bool = False
    """Simulated nodes: give each node its own NCCL host id, so NCCL moves the traffic between nodes over its
    network transport (sockets) as between machines, instead of NVLink or shared memory within one host."""
    master_addr: str = "127.0.0.1"
    """Where node 0 hosts the rendezvous (torchrun's ``--master-addr``, the Ray head's address); simulated nodes
    need an address of this host."""
    master_port: int | None = Field(None, ge=1, le=65535)
    """The rendezvous port on ``master_addr`` (torchrun's, or the Ray head's GCS port); default: a free one."""
    weight_sync: Literal["object_store", "collective"] = "object_store"
    """controller single: how the actor's new weights reach the rollout group each step: through Ray's
    object store (host memory), or broadcast from actor rank 0 (NCCL on GPU, gloo on CPU)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)

    @field_validator("device_map")
    @classmethod
    def _known_roles(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        unknown = sorted(set(v) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r}; roles are {', '.join(ROLES)}")
        for role, idx in v.items():
            if any(i < 0 for i in idx) or len(set(idx)) != len(idx):
                raise ValueError(f"{role}: device indices must be distinct and >= 0")
        return v

    def compiles(self, *, gpu: bool, world: int) -> bool:
        """Whether a role on ``world`` ranks (on a GPU or not) is compiled: ``compile`` when set, else (``auto``)
        exactly when it runs as the plain module on a GPU (:meth:`MemoryConfig.shards`)."""
        if self.compile != "auto":
            return self.compile
        return gpu and not self.memory.shards(gpu=gpu, world=world)

    @model_validator(mode="after")
    def _rollout_replicas_divide(self) -> "SystemConfig":
        tp, gpus = self.rollout.tensor_parallel_size, self.device_map.get("rollout") or []
        if tp == 1:
            return self
        if self.rollout.backend == "hf":
            raise ValueError(f"system.rollout.tensor_parallel_size {tp} needs a vLLM backend (hf generates with the "
                             "actor's own module); set it to 1 or use backend vllm or vllm_server")
        if self.rollout.server_url is not None:
            raise ValueError(f"system.rollout.tensor_parallel_size {tp} applies to engines tunekit starts; a server at "
                             "system.rollout.server_url keeps its own, so set it to 1")
        if len(gpus) < tp:
            raise ValueError(f"system.rollout.tensor_parallel_size {tp} is more than the {len(gpus)} rollout GPU(s) of "
                             "system.device_map.rollout; give the rollout at least that many GPUs or lower it")
        if len(gpus) % tp:
            raise ValueError(f"system.rollout.tensor_parallel_size {tp} does not divide the {len(gpus)} rollout GPUs "
                             "of system.device_map.rollout (rollout GPUs = replicas x tensor_parallel_size); use a "
                             "divisor of their count")
        return self

    @property
    def rollout_replicas(self) -> list[list[int]]:
        """The rollout engines: consecutive groups of ``rollout.tensor_parallel_size`` rollout devices, one per
        engine (empty: a server elsewhere)."""
        gpus, tp = list(self.device_map.get("rollout") or []), self.rollout.tensor_parallel_size
        return [gpus[i:i + tp] for i in range(0, len(gpus), tp)]

    @property
    def devices(self) -> list[int]:
        """Every device index any role holds (held-but-idle ones are paid for too)."""
        return sorted({i for idx in self.device_map.values() for i in idx})

    @property
    def world_size(self) -> int:
        """GPUs held (what a probe pays for), a vLLM server's own GPUs included."""
        return max(1, len(self.devices))


class ProfilerConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    nvml_interval_s: float = Field(0.2, gt=0)
    comm_steps: int = Field(3, ge=0)
    """Steps profiled with torch.profiler for communication (0: off)."""
    comm_start_step: int | None = Field(None, ge=0)
    """First profiled step; default: the probe's last ``comm_steps`` steps, after warm-up (profiling slows the
    steps that follow it)."""
    comm_skip_phases: list[str] = Field(default_factory=lambda: ["gen"])
    """Phases never profiled for communication (generation: too many kernels to profile cheaply)."""
    trace: bool = False
    """Save the torch.profiler traces of the sampled steps."""


class ProbeConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    steps: int = Field(100, gt=0)
    seed: int = 0
    warmup_steps: int = Field(3, ge=0)
    timeout_s: float = Field(1800.0, gt=0)
    stall_timeout_s: float | None = Field(None, gt=0)
    """A probe that has finished a step and then finishes none for this long is hung (status timeout);
    default: only ``timeout_s`` bounds it. Startup (model load, engine start) is not counted."""
    out: str = "runs"


class RunConfig(Strict):
    """The full training run a probe's cost is projected to, defined by the work it must do, not a step count:
    a knob that changes the batch changes how many steps the same work takes."""

    effect: ClassVar[Effect] = "probe"
    until: Literal["samples", "threshold"] = "samples"
    """``samples``: the run trains on ``samples`` training samples, ceil(samples / samples per step) steps.
    ``threshold``: the run lasts until its smoothed reward (mean of the last ``search.reward_window`` steps) first
    reaches ``search.reward_threshold``, the step read off the probe's own reward curve; a probe that does not get
    there has no run length and is infeasible (never extrapolated)."""
    samples: int = Field(32000, gt=0)
    """Training samples (prompts x samples per prompt, summed over steps) of the full run, with ``until: samples``."""


class SearchParam(Strict):
    effect: ClassVar[Effect] = "probe"
    key: str
    type: Literal["categorical", "int", "float"]
    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: dict[str, Any] | None = None
    """Condition: only sampled when these dotted keys have these values."""


class SearchConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    reward_threshold: float = 0.5
    reward_window: int = Field(10, gt=0)
    """Feasibility reads the mean reward of the last K steps (with its bootstrap interval); with
    ``run.until: threshold`` the smoothed reward is the mean of the last K steps at each step."""
    space: list[SearchParam] = Field(default_factory=list)
    probe_steps: int | None = Field(None, gt=0)
    confirm_top: int = Field(2, ge=0)
    """When the search stops, the cheapest this many feasible or within-noise configurations are probed again
    with the baseline, with fresh seeds, alternating in one run; 0: no confirmation round."""
    skip_by_estimate: bool = True
    """Skip a sampled configuration, without probing it, when the cost model calibrated on this search's own probes
    (two at least) puts the low bound of its full run over 2x the best feasible trial's cost
    (``tunekit.search.screen``); it is recorded as ``skipped`` with the reason ``estimated too costly``. false: probe
    every sampled configuration."""
    confirm_seeds: int = Field(2, gt=0)
    """Fresh seeds of the confirmation round: each candidate and the baseline run once per seed, each round
    starting one configuration further along. A saving is confirmed only over two rounds or more: in one round
    the order the probes ran in (a machine's first probe pays its warm-ups) cannot be told from the configuration."""


class Recipe(Strict):
    """A probe's whole configuration: what to train, how, on what, and what to search."""

    effect: ClassVar[Effect] = "probe"
    """``name`` and ``description`` change nothing that runs."""

    name: str = "default"
    description: str = ""
    runner: RunnerName = Field("builtin", json_schema_extra=SYSTEMS)
    """What runs the probe: ``builtin`` (tunekit's own trainer), ``trl`` (TRL's GRPOTrainer) or ``verl`` (verl's PPO trainer). The same knobs and records under every runner;
    a knob a runner cannot express is refused before the probe starts."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    system: SystemConfig = Field(default_factory=SystemConfig)
    profiler: ProfilerConfig = Field(default_factory=ProfilerConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)

    @property
    def roles(self) -> list[str]:
        """The roles this recipe's algorithm runs (each needs devices in ``system.device_map``)."""
        algo = self.algorithm
        return ["actor"] + (["ref"] if algo.uses_ref else []) + ["rollout", "reward"] + (["critic"] if algo.uses_critic else [])

    @model_validator(mode="after")
    def _batch_divides(self) -> "Recipe":
        b = self.system.batch
        if b.samples_per_step % b.mini_batch:
            raise ValueError(
                f"system.batch.mini_batch_size {b.mini_batch} must divide the step batch "
                f"{b.samples_per_step} (prompts_per_step x samples_per_prompt)"
            )
        if b.mini_batch % b.micro_batch:
            raise ValueError(
                f"system.batch.micro_batch_size {b.micro_batch_size} must divide the mini-batch {b.mini_batch}"
            )
        start = self.profiler.comm_start_step
        if start is not None and start + self.profiler.comm_steps > self.probe.steps:
            raise ValueError(
                f"profiler.comm_start_step {start} + comm_steps {self.profiler.comm_steps} runs past the probe's "
                f"{self.probe.steps} steps; profile steps inside the probe"
            )
        if self.algorithm.name == "grpo" and b.samples_per_prompt < 2:
            raise ValueError("algorithm grpo needs system.batch.samples_per_prompt >= 2 for a group baseline")
        return self

    @model_validator(mode="after")
    def _engine_accepts(self) -> "Recipe":
        """Engine settings vLLM's scheduler would refuse at start-up, refused before anything starts."""
        rc, longest = self.system.rollout, PROMPT_TOKEN_BUDGET + self.task.max_new_tokens
        seqs, tokens = rc.max_num_seqs, rc.max_num_batched_tokens
        if seqs is not None and tokens is not None and tokens < seqs:
            raise ValueError(f"system.rollout.max_num_batched_tokens {tokens} is below max_num_seqs {seqs}; vLLM "
                             "schedules at least one token per sequence, so raise it or lower max_num_seqs")
        if (rc.max_num_batched_tokens is not None and rc.enable_chunked_prefill is False
                and rc.max_num_batched_tokens < longest):
            raise ValueError(
                f"system.rollout.max_num_batched_tokens {rc.max_num_batched_tokens} is below the longest sequence "
                f"{longest} ({PROMPT_TOKEN_BUDGET} prompt + task.max_new_tokens) while enable_chunked_prefill is "
                "false; vLLM refuses that, so raise it or enable chunked prefill"
            )
        return self


# ---------------------------------------------------------------- loading


def _parse_value(text: str) -> Any:
    """An override value is YAML: ``4`` is an int, ``[0,1]`` a list, ``vllm`` a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _known_path(keys: list[str]) -> bool:
    """Whether a dotted key names a field of the recipe (dicts such as device_map accept any key)."""
    model: Any = Recipe
    for i, k in enumerate(keys):
        fields = getattr(model, "model_fields", None)
        if fields is None or k not in fields:
            return False
        ann = fields[k].annotation
        sub = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub = ann
        if sub is None:
            return i == len(keys) - 1 or str(ann).startswith("dict")
        model = sub
    return True


def apply_overrides(raw: dict, overrides: list[str], *, source: str = "--set") -> dict:
    """Apply ``dotted.key=value`` strings to a raw recipe mapping (copy)."""
    data = yaml.safe_load(yaml.safe_dump(raw)) or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected dotted.key=value, e.g. system.batch.micro_batch_size=4.")
        key, value = item.split("=", 1)
        keys = key.strip().split(".")
        if not _known_path(keys):
            raise ConfigError(f"{source} {key!r}: no such key in the recipe; run `tunekit recipes --keys` to list them.")
        node = data
        if keys[:2] == ["system", "device_map"] and len(keys) == 3:
            # one role's devices: start from the default map instead of replacing it
            data.setdefault("system", {}).setdefault("device_map", SystemConfig().model_dump()["device_map"])
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source} {key!r}: {k!r} is not a section.")
        node[keys[-1]] = _parse_value(value)
    return data


def _error_sentence(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key '{where}'; remove it or check the spelling (see `tunekit recipes --keys`)."
    msg = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return f"{source}: {msg}; fix the recipe."
    got = first.get("input")
    got_txt = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{source}: key '{where}': {msg}{got_txt}; fix the value."


def recipe_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.exists():
        return p
    for cand in (RECIPES_DIR / name_or_path, RECIPES_DIR / f"{name_or_path}.yaml"):
        if cand.exists():
            return cand
    names = ", ".join(sorted(x.stem for x in RECIPES_DIR.glob("*.yaml")))
    raise ConfigError(f"recipe {name_or_path!r} not found; give a YAML path or one of: {names}.")


def load_raw(name_or_path: str | None) -> tuple[dict, str]:
    if name_or_path is None:
        return {}, "(embedded default)"
    path = recipe_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{line} is not valid YAML ({getattr(e, 'problem', e)}); fix the syntax.") from None
    if raw is None:
        raise ConfigError(f"{path}: the recipe file is empty; write the sections to change (model, task, algorithm, system, "
                          "probe) or leave out --recipe to run the embedded default.")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections (model, task, algorithm, system, probe).")
    return raw, str(path)


def validate(raw: dict, source: str) -> Recipe:
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_error_sentence(e, source)) from None


def load_recipe(name_or_path: str | None = None, overrides: list[str] | None = None) -> Recipe:
    """Recipe file (or the embedded default) + ``--set`` overrides → validated Recipe."""
    raw, source = load_raw(name_or_path)
    data = apply_overrides(raw, overrides or [])
    if overrides:
        source = f"{source} with --set {' '.join(overrides)}"
    return validate(data, source)


def dump_recipe(recipe: Recipe) -> str:
    """Fully resolved YAML (every default written out)."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def list_keys(model: type[BaseModel] = Recipe, prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann is not SearchConfig:
            out += list_keys(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def effect_of(key: str) -> Effect:
    """What a dotted recipe key changes (see :data:`Effect`): the field's own declaration, else its section's."""
    model: type[BaseModel] = Recipe
    for k in key.split("."):
        f = model.model_fields[k]
        declared = (f.json_schema_extra or {}).get("effect") if isinstance(f.json_schema_extra, dict) else None
        if declared:
            return declared
        ann = f.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return model.effect
        model = ann
    return model.effect


def what_runs(recipe: Recipe) -> dict[str, Any]:
    """Every key that changes what a training step runs (``learning`` and ``systems``), by dotted key."""
    data = recipe.model_dump(mode="json")
    out = {}
    for key in list_keys():
        if effect_of(key) != "probe":
            node: Any = data
            for k in key.split("."):
                node = node[k]
            out[key] = node
    return out
