"""``system``: where and how a step runs (batch, rollout engine, memory, controller, devices). Systems knobs, except
the global batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tunekit.config.base import LEARNING, ROLES, Effect, ServerUrl, Strict


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
    ENGINE_FIELDS: ClassVar[tuple[str, ...]] = (
        "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
        "enable_chunked_prefill", "tensor_parallel_size", "enforce_eager", "torch_compile")
    """The keys a vLLM engine is built with: two rollouts that agree on them (and on the model) serve alike."""
    backend: Literal["hf", "vllm", "vllm_server"] = "hf"
    """hf: ``generate`` on the actor; vllm: an in-process engine; vllm_server: a vLLM server over HTTP."""
    gpu_memory_utilization: float = 0.5
    """Fraction of each rollout GPU's memory vLLM may take (weights + KV cache)."""
    enable_sleep: bool = True
    """Sleep/wake the vLLM engine around training phases when colocated."""
    logprobs: bool | Literal["auto"] = "auto"
    """vLLM backends: ask the engine for each sampled token's logprob. Only the check of the engine against the
    actor reads them (``rollout/logprob_abs_diff_mean``; the update recomputes its own), and the engine builds them
    token by token on the host, which slows generation. ``auto``: asked for
    by tunekit's trainer, left to verl's own default (``calculate_log_probs``); ``false`` skips them and the check.
    HF ``generate`` has them from its scores at no cost and always returns them."""
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
    server_url: ServerUrl = None
    """An existing vLLM server (``http://host:port``); default: tunekit starts one on the rollout GPUs."""
    server_timeout_s: float = Field(300.0, gt=0)
    """How long to wait for a server tunekit starts to answer ``/health``."""

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util_range(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError("must be in (0, 1], e.g. 0.5")
        return v


def serving_key(rollout: Mapping[str, Any] | None, model: Mapping[str, Any] | None) -> tuple | None:
    """What makes two rollouts serve alike, from a recipe's ``system.rollout`` and ``model`` as dumped (a run's
    config.yaml, a load test's record): the model and :attr:`RolloutConfig.ENGINE_FIELDS`. None when either is
    unknown."""
    if not rollout or not model:
        return None
    return (model.get("preset"), model.get("path"), *(rollout.get(k) for k in RolloutConfig.ENGINE_FIELDS))


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
    plain module in bf16 (``master_weights``): no all-gather, reduce-scatter and casts around every
    block. ``auto``: the plain module, unless parameter offload asks for FSDP2 (only FSDP2 offloads). Several GPUs
    for a role always shard; one CPU rank never does (:meth:`shards`)."""

    master_weights: bool | Literal["auto"] = "auto"
    """A trained role that is the plain module on a GPU (see ``fsdp_single_gpu``): ``true`` keeps its weights in
    bf16 for compute and fp32 master weights, gradients and AdamW state beside them, as Megatron-LM does (each
    micro-batch's gradients added into the fp32 ones in one call, the masters copied into the bf16 weights after
    each step); ``false`` keeps fp32 weights under bf16 autocast, as TRL runs one GPU, which casts every weight in
    every micro-batch's forward and every gradient in its backward. ``true`` holds 2 bytes a parameter more.
    ``auto``: ``true`` in tunekit's trainer, the framework's own way under another runner (TRL: autocast).
    No effect under FSDP2, whose mixed-precision policy casts per block."""

    def shards(self, *, gpu: bool, world: int) -> bool:
        """Whether a role on ``world`` ranks runs under FSDP2: on several ranks, with parameter offload, or on one
        GPU when ``fsdp_single_gpu`` is ``true``; otherwise it is the plain module."""
        return world > 1 or self.param_offload or (gpu and self.fsdp_single_gpu is True)

    def keeps_masters(self, *, gpu: bool, world: int) -> bool:
        """Whether a trained role of tunekit's trainer keeps fp32 master weights beside bf16 ones (``master_weights``
        not ``false``): the plain module on a GPU."""
        return gpu and self.master_weights is not False and not self.shards(gpu=gpu, world=world)


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
    GPU, no offload), not on CPU and not under FSDP2
    (:meth:`compiles`). A pure systems knob like those of ``memory``."""
    cuda_graphs: bool | Literal["auto"] = "auto"
    """Replay a compiled plain module's passes as CUDA graphs (torch.compile's ``mode="reduce-overhead"``): one launch
    a pass instead of one per kernel, for a model too small to keep the GPU busy between the host's launches.
    ``auto`` and ``true`` apply it (:meth:`captures`) where a role is compiled as the plain module on a GPU with
    master weights (its gradients leave the graphs' memory after each micro-batch), and elsewhere have no effect;
    another runner refuses ``true``. Each sequence width records its own graph, once. The graphs' memory pool is
    never handed back, so it stays beside a waking engine or HF generation: ``auto`` leaves the graphs out where the
    memory estimate says that pool is what puts the probe over its card (:func:`tunekit.estimate.memory.graphs_left_out`).
    The first update of each width is longer: it records the graph. A pure systems knob."""
    graph_width_multiple: int = Field(32, ge=1)
    """Where the trainer's roles replay CUDA graphs (:meth:`captures`): each step's batch is left-padded to a width
    that is a multiple of this many tokens (masked columns: every token's forward is the same), so the graphs
    are recorded for a few widths, each once, instead of once for every width a step brings. 1: no rounding.
    A pure systems knob."""
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
    one host); on real machines run ``python -m tunekit.placement.nodes RUN_DIR --node-rank N`` on each node N (it prints
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

    def captures(self, *, gpu: bool, world: int) -> bool:
        """Whether a role on ``world`` ranks replays its compiled passes as CUDA graphs: ``cuda_graphs`` not false,
        where the role is compiled (:meth:`compiles`) as the plain module with master weights
        (:meth:`MemoryConfig.keeps_masters`)."""
        return (self.cuda_graphs is not False and self.compiles(gpu=gpu, world=world)
                and self.memory.keeps_masters(gpu=gpu, world=world))

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
