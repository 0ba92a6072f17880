"""The memory verdict before launch: peak memory per GPU and role, estimated from the model's shapes, the batch and
the memory knobs, checked against the card's memory (the price profile's ``memory_gib``).

Per role and GPU (bytes; a role's states are sharded over its GPUs, as FSDP2 shards them):

- a trained role (actor, critic): master weights, gradients (the masters' dtype) and AdamW's two moments;
  parameter offload moves all three to the host; the plain module on a GPU with ``master_weights`` also holds
  its bf16 weights for compute;
- a frozen role (ref): its weights (bf16 when the plain module on a GPU);
- activations of one micro-batch (the transient part): per token and layer, the bf16 tensors a decoder block
  keeps for backward without recomputation, about eight of the hidden width (norm and projection inputs, Q, K, V,
  attention output, residual; flash attention keeps no ``s^2`` scores) and four of the MLP's width (gate, up,
  activation, down-projection input, as in a SwiGLU block), after Korthikanti et al. (2022); with gradient
  checkpointing only each block's input plus one block's worth; the actor's logits over the
  response tokens in fp32 (logits and their log-softmax); the unsharded bf16 parameters FSDP gathers (two blocks
  in flight with reshard-after-forward, the whole model without it), or for the plain module (one GPU,
  ``fsdp_single_gpu`` off or ``auto``) a bf16 copy of the model: the micro-batch's bf16 gradients before they are
  added into the masters' (``master_weights``), or the bf16 copy of every fp32 weight autocast keeps for backward
  (eager's figure: a compiled graph may recompute the casts instead);
- the rollout: a vLLM engine takes ``gpu_memory_utilization`` x the card; asleep while training runs it holds
  nothing, so it only adds to the resident states. Its bf16 weights, split over ``tensor_parallel_size`` GPUs, must
  fit inside that pool (vLLM refuses to start otherwise: the GPU's verdict is ``would not fit``). HF generation
  keeps a bf16 replica (unless it generates with the actor) and its KV cache;
- the caching allocator's slack: what it reserves beyond what is allocated, a share of each transient part
  (blocks are rounded up and cached, and a transient part churns through many sizes);
- a role whose compiled passes replay as CUDA graphs (``system.cuda_graphs``): its activations live in the graphs'
  private memory pool, which CUDA Graph Trees share among every graph of the device (dead memory of one graph is
  reused by the next) and never hand back, so a GPU holds the largest such role's activations for the whole step,
  beside the waking engine too, and no slack is added to them;
- per GPU, memory no allocator counts: each process's CUDA context, loaded kernels and cuBLAS workspaces, the
  builtin trainer's engine's captured CUDA graphs (``enforce_eager: false``), and NCCL's buffers when the run spans
  GPUs.

Colocated roles time-share a GPU: their resident states add up, their transient parts do not overlap, so a GPU's
peak is the sum of resident bytes plus the CUDA graphs' pool plus the largest transient part plus the memory outside
the allocator. One exception: under the builtin trainer the caching allocator keeps training's blocks (the largest
training transient part and its slack) when the engine wakes, since the trainer hands them back only when the
engine's pool would not fit beside them (``vllm_engine.must_empty_cache``; TRL empties the cache before each wake);
so on a card that holds both, the waking engine's peak has them too. A reward
model is not counted. Which of these a runner's framework does (bf16 weights beside the masters, a plain reference in
bf16, training replayed as CUDA graphs, its engine's graphs outside the allocator, cached blocks kept as the engine
wakes) its traits say (:class:`~tunekit.estimate.traits.RunnerTraits`), which the caller hands in.

The peak is what NVML reports as used on the GPU (every process, the engine's pool included): a probe records it
per GPU as ``nvml/mem_used_gb/<gpu>``, and its summary sets the estimate beside it (``memory/estimate_error``).
The allocator's own peak (``perf/max_memory_reserved_gb``) is no measure of it: it misses the memory outside the
allocator, and it keeps counting a sleeping engine's pool, which vLLM's sleep mode unmaps under the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunekit import metrics
from tunekit.config import PROMPT_TOKEN_BUDGET, Recipe
from tunekit.placement.backends import backend_of, rollout_shares_trainer_gpus
from tunekit.metrics import GIB
from tunekit.estimate.traits import RunnerTraits

HEADROOM = 0.10
"""Share of the card kept free: a peak above (1 - HEADROOM) x card is ``tight`` (the estimate's own error lives
there)."""
HIDDEN_TENSORS, MLP_TENSORS = 8, 4
"""bf16 tensors of the hidden and of the MLP width a decoder block keeps per token for backward."""
LOGIT_BYTES = 16
"""Per response token and vocabulary entry in an update: bf16 logits, their fp32 copy and log-softmax, and the
gradients of both."""
FORWARD_LOGIT_BYTES = 10
"""The same without gradients (a reference's log-probabilities): bf16 logits, fp32 copy and log-softmax."""
HF_SCORE_BYTES = 12
"""HF ``generate`` with scores, per generated token and vocabulary entry: fp32 scores kept for every step, their
log-softmax, and the stacked copy."""
ALLOCATOR_SLACK = 0.25
"""The caching allocator's reserved-over-allocated bytes as a share of a training transient part: the activations
and logits that churn through the allocator leave about a quarter of themselves reserved beyond what is allocated
(``perf/max_memory_reserved_gb`` over ``perf/max_memory_allocated_gb``)."""
HF_GENERATE_SLACK = 0.45
"""The same for HF generation, whose KV cache grows by one token a step (a new, larger tensor each step), so a larger
share of its cache and scores stays reserved."""
NON_TORCH_GIB = 1.9
"""Memory outside the allocator per process on a GPU (CUDA context, loaded kernels, cuBLAS/cuBLASLt workspaces):
NVML's used minus ``perf/max_memory_reserved_gb``, measured on single-process H200 probes (torch 2.11, CUDA 13;
``benchmarks/README.md``, the memory estimate). Lazy module loading (CUDA 11.7+) keeps the context itself at about
0.5 GiB; the rest is workspaces and kernels."""
ENGINE_GRAPHS_GIB = 2.45
"""Memory outside the allocator that the builtin trainer's vLLM engine adds on its GPU when it captures CUDA graphs
(``enforce_eager: false``, with vLLM's torch.compile): NVML's used minus ``perf/max_memory_reserved_gb`` on
single-process H200 probes of SmolLM2-135M with such an engine (vLLM 0.25), with the trainer's own graphs and
without, less :data:`NON_TORCH_GIB` (``benchmarks/README.md``, the memory estimate). Not added for TRL's colocated
engine, which captures graphs too and is estimated within its NVML peak without it."""
NCCL_GIB = 0.35
"""NCCL's buffers and communicators per GPU when the run spans GPUs (NCCL_BUFFSIZE is 4 MiB per channel and peer):
what a two-GPU H200 probe of the tiny model used a GPU beyond a one-GPU probe's."""

Verdict = Literal["fits", "tight", "would not fit", "unknown"]


@dataclass(frozen=True)
class ModelShape:
    n_params: int
    n_layers: int
    hidden: int
    vocab: int
    kv_dim: int
    """Key/value heads x head size: one token's K (or V) per layer."""
    intermediate: int
    """The MLP's width."""

    @property
    def block_bytes_per_token(self) -> int:
        """bf16 activation bytes one decoder block keeps per token for backward."""
        return 2 * (HIDDEN_TENSORS * self.hidden + MLP_TENSORS * self.intermediate)


@dataclass(frozen=True)
class RoleMemory:
    """One role's bytes on each of its GPUs."""

    role: str
    gpus: tuple[int, ...]
    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    engine: float | None = 0.0
    """A vLLM engine's pool (None: the card is unknown, so the pool is too)."""
    engine_weights: float = 0.0
    """The engine's weight shard on each of its GPUs (bf16 weights / tensor-parallel size), held inside its pool."""
    engine_sleeps: bool = False
    slack: float = 0.0
    """The caching allocator's reserve beyond the activations (ALLOCATOR_SLACK, HF_GENERATE_SLACK)."""
    graphed: bool = False
    """The activations live in the CUDA graphs' pool (resident, shared with the GPU's other graphed roles)."""

    @property
    def engine_short(self) -> bool:
        """The engine's pool cannot hold its weight shard, so the engine cannot start."""
        return self.engine is not None and self.engine_weights > self.engine

    @property
    def resident(self) -> float | None:
        """Held for the whole step."""
        if self.engine is None:
            return None
        return self.weights + self.grads + self.optimizer + (0.0 if self.engine_sleeps else self.engine)

    @property
    def transient(self) -> float | None:
        """Held only while this role's phase runs."""
        if self.engine is None:
            return None
        own = 0.0 if self.graphed else self.activations + self.slack
        return own + (self.engine if self.engine_sleeps else 0.0)

    @property
    def total(self) -> float | None:
        r, t = self.resident, self.transient
        return None if r is None or t is None else r + t + (self.activations if self.graphed else 0.0)


@dataclass(frozen=True)
class GpuMemory:
    gpu: int
    roles: tuple[str, ...]
    peak: float | None
    card: float | None
    outside: float = 0.0
    """Memory outside the allocator, part of ``peak``: CUDA contexts of the processes here, NCCL's buffers."""
    engine_short: bool = False
    """A rollout engine here cannot hold its weight shard in its pool."""

    @property
    def verdict(self) -> Verdict:
        return "would not fit" if self.engine_short else verdict(self.peak, self.card)


@dataclass(frozen=True)
class MemoryEstimate:
    roles: list[RoleMemory]
    gpus: list[GpuMemory]

    @property
    def peak(self) -> float | None:
        """The fullest GPU's estimated peak (bytes)."""
        peaks = [g.peak for g in self.gpus]
        return None if not peaks or None in peaks else max(peaks)  # type: ignore[type-var]

    @property
    def verdict(self) -> Verdict:
        order: list[Verdict] = ["would not fit", "unknown", "tight", "fits"]
        return min((g.verdict for g in self.gpus), key=order.index, default="unknown")


def verdict(peak: float | None, card: float | None, headroom: float = HEADROOM) -> Verdict:
    if peak is None or card is None:
        return "unknown"
    if peak > card:
        return "would not fit"
    return "tight" if peak > (1 - headroom) * card else "fits"


def prompt_tokens(recipe: Recipe) -> int:
    """Longest prompt: the generated arithmetic prompt (``a+b=``, one token a character) or, with a dataset, its
    longest row as the model is fed it (chat template included; :func:`tunekit.workload.lengths.longest_fed_prompt`),
    at most the engine's prompt budget. Where the dataset or the tokenizer cannot be read here (the preflight says
    why), the budget: an upper bound."""
    from tunekit.workload.lengths import longest_fed_prompt

    t = recipe.task
    if t.dataset is None:
        return 2 * len(str(t.max_operand)) + 2
    longest = longest_fed_prompt(recipe)
    return PROMPT_TOKEN_BUDGET if longest is None else min(longest, PROMPT_TOKEN_BUDGET)


def _trained(role: str, recipe: Recipe, shape: ModelShape, traits: RunnerTraits, *, lm_head: bool,
             graphs: bool) -> RoleMemory:
    gpus = tuple(recipe.system.device_map.get(role) or [0])
    mem, n = recipe.system.memory, len(gpus)
    master = 2 if recipe.model.dtype == "bfloat16" else 4
    shard = shape.n_params / n
    weights = 0.0 if mem.param_offload else master * shard
    if master == 4 and traits.bf16_beside_masters and mem.keeps_masters(gpu=True, world=n):
        weights += 2 * shape.n_params  # the bf16 weights the plain module computes with
    grads = 0.0 if mem.param_offload else master * shard
    optimizer = 0.0 if mem.param_offload else 2 * master * shard
    acts = _activations(recipe, shape, logits=lm_head)
    block = 2 * shape.n_params / shape.n_layers  # one decoder block, unsharded, in bf16
    gathered = 2 * block if mem.reshard_after_forward else 2 * shape.n_params
    if not mem.shards(gpu=True, world=n):  # the plain module: bf16 gradients, or autocast's bf16 weight copies
        gathered = 2 * shape.n_params if master == 4 else 0.0
    return RoleMemory(role, gpus, weights, grads, optimizer, acts + gathered, slack=ALLOCATOR_SLACK * (acts + gathered),
                      graphed=graphs and _graphed(recipe, traits, n))


def _graphed(recipe: Recipe, traits: RunnerTraits, world: int) -> bool:
    """Whether a role on ``world`` GPUs replays CUDA graphs (:meth:`SystemConfig.captures`, where its runner does)."""
    return traits.training_graphs and recipe.system.captures(gpu=True, world=world)


def _activations(recipe: Recipe, shape: ModelShape, *, logits: bool) -> float:
    b, t = recipe.system.batch, recipe.task
    tokens = b.micro_batch * (prompt_tokens(recipe) + t.max_new_tokens)
    if recipe.system.memory.gradient_checkpointing:  # every block's bf16 input, and one block recomputed
        kept = tokens * (2 * shape.hidden * shape.n_layers + shape.block_bytes_per_token)
    else:
        kept = tokens * shape.block_bytes_per_token * shape.n_layers
    head = b.micro_batch * t.max_new_tokens * shape.vocab * LOGIT_BYTES if logits else 0
    return float(kept + head)


def _ref(recipe: Recipe, shape: ModelShape, traits: RunnerTraits, *, graphs: bool) -> RoleMemory:
    gpus = tuple(recipe.system.device_map.get("ref") or [0])
    plain_bf16 = traits.plain_ref_bf16 and not recipe.system.memory.shards(gpu=True, world=len(gpus))
    master = 2 if recipe.model.dtype == "bfloat16" or plain_bf16 else 4  # the plain module's frozen weights: bf16
    b, t = recipe.system.batch, recipe.task
    logits = b.micro_batch * t.max_new_tokens * shape.vocab * FORWARD_LOGIT_BYTES  # forward only: no activations kept
    return RoleMemory("ref", gpus, weights=master * shape.n_params / len(gpus), activations=float(logits),
                      slack=ALLOCATOR_SLACK * logits, graphed=graphs and _graphed(recipe, traits, len(gpus)))


def _rollout(recipe: Recipe, shape: ModelShape, card: float | None) -> RoleMemory:
    s = recipe.system
    rc, gpus = s.rollout, tuple(s.device_map.get("rollout") or [])
    if backend_of(rc).generates_with_policy:
        gpus = gpus or (0,)
        shares_actor = s.controller == "spmd" and set(gpus) == set(s.device_map.get("actor") or [0])
        rows = s.batch.samples_per_step / len(gpus)
        kv = rows * (prompt_tokens(recipe) + recipe.task.max_new_tokens) * shape.n_layers * 2 * shape.kv_dim * 2
        scores = rows * recipe.task.max_new_tokens * shape.vocab * HF_SCORE_BYTES
        return RoleMemory("rollout", gpus, weights=0.0 if shares_actor else 2.0 * shape.n_params, activations=kv + scores,
                          slack=HF_GENERATE_SLACK * (kv + scores))
    if rc.server_url or not gpus:
        return RoleMemory("rollout", gpus)  # a server elsewhere holds nothing here
    pool = None if card is None else rc.gpu_memory_utilization * card
    return RoleMemory("rollout", gpus, engine=pool, engine_weights=2.0 * shape.n_params / rc.tensor_parallel_size,
                      engine_sleeps=rc.enable_sleep and rollout_shares_trainer_gpus(s))


def role_memory(recipe: Recipe, shape: ModelShape, card: float | None, *, traits: RunnerTraits,
                graphs: bool) -> list[RoleMemory]:
    """Every role the recipe runs, with its bytes per GPU (``card``: the card's bytes, for the engine's pool;
    ``traits``: its runner's). ``graphs`` false: as if no role replayed CUDA graphs."""
    out = [_trained("actor", recipe, shape, traits, lm_head=True, graphs=graphs)]
    if recipe.algorithm.uses_critic:
        out.append(_trained("critic", recipe, shape, traits, lm_head=False, graphs=graphs))
    if recipe.algorithm.uses_ref:
        out.append(_ref(recipe, shape, traits, graphs=graphs))
    out.append(_rollout(recipe, shape, card))
    return out


def processes_on(recipe: Recipe, roles_here: list[str]) -> int:
    """Processes holding a CUDA context on one GPU: under spmd the trainer rank (an in-process engine shares it),
    plus a vLLM server tunekit starts there; under the single controller one worker per role placed there."""
    s = recipe.system
    if s.controller == "single":
        return max(1, len(roles_here))
    spec = backend_of(s.rollout)
    server = spec.starts_server(s.rollout) and "rollout" in roles_here
    trainer = any(r != "rollout" for r in roles_here) or spec.in_trainer_ranks
    return int(trainer) + int(server)


def outside_allocator(recipe: Recipe, roles_here: list[str], *, traits: RunnerTraits) -> float:
    """Bytes on one GPU that no allocator counts (NON_TORCH_GIB per process, ENGINE_GRAPHS_GIB for an in-process vLLM
    engine here when it captures CUDA graphs and its runner's hold memory there (``traits``), NCCL_GIB when the run
    spans GPUs)."""
    s = recipe.system
    nccl = NCCL_GIB if s.world_size > 1 else 0.0
    vllm_here = ("rollout" in roles_here and not backend_of(s.rollout).generates_with_policy
                 and not s.rollout.server_url)
    graphs = ENGINE_GRAPHS_GIB if vllm_here and not s.rollout.enforce_eager and traits.engine_graphs_outside else 0.0
    return (processes_on(recipe, roles_here) * NON_TORCH_GIB + graphs + nccl) * GIB


def estimate_memory(recipe: Recipe, shape: ModelShape, card_gib: float | None, *,
                    traits: RunnerTraits) -> MemoryEstimate:
    """Peak bytes per GPU and role, and the verdict against a card of ``card_gib`` GiB (None: unknown); with the CUDA
    graphs the probe would replay on that card (:func:`graphs_left_out`); ``traits``: the recipe's runner's."""
    return _graphs_settled(recipe, shape, card_gib, traits)[0]


def graphs_left_out(recipe: Recipe, card_gib: float | None, *, traits: RunnerTraits) -> bool:
    """Whether ``system.cuda_graphs: auto`` leaves out CUDA graphs a role would replay, because their pool is what puts
    the estimate over cards of ``card_gib`` GiB (the probe fits without it); ``true`` keeps them regardless."""
    return _graphs_settled(recipe, model_shape(recipe), card_gib, traits)[1]


def graphs_for_card(recipe: Recipe, card_gib: float | None, shape: ModelShape | None = None, *,
                    traits: RunnerTraits) -> Recipe:
    """``recipe`` with ``system.cuda_graphs: auto`` settled to false where the memory estimate leaves the graphs out
    on cards of ``card_gib`` GiB (:func:`graphs_left_out`), so a probe runs, and the cost model prices, what was
    estimated; otherwise unchanged. ``shape``: the model's, where the caller has read it already."""
    if card_gib is None or not _graphs_settled(recipe, shape or model_shape(recipe), card_gib, traits)[1]:
        return recipe
    return recipe.model_copy(update={"system": recipe.system.model_copy(update={"cuda_graphs": False})})


def _graphs_settled(recipe: Recipe, shape: ModelShape, card_gib: float | None,
                    traits: RunnerTraits) -> tuple[MemoryEstimate, bool]:
    """The estimate with the CUDA graphs the probe would replay on the card, and whether ``auto`` left them out."""
    with_graphs = _estimate(recipe, shape, card_gib, traits, graphs=True)
    if (recipe.system.cuda_graphs != "auto" or with_graphs.verdict != "would not fit"
            or not any(r.graphed for r in with_graphs.roles)):
        return with_graphs, False
    without = _estimate(recipe, shape, card_gib, traits, graphs=False)
    return (with_graphs, False) if without.verdict == "would not fit" else (without, True)


def _estimate(recipe: Recipe, shape: ModelShape, card_gib: float | None, traits: RunnerTraits, *,
              graphs: bool) -> MemoryEstimate:
    card = None if card_gib is None else card_gib * GIB
    roles = role_memory(recipe, shape, card, traits=traits, graphs=graphs)
    gpus = []
    for g in sorted({i for r in roles for i in r.gpus}):
        here = [r for r in roles if g in r.gpus]
        resident = [r.resident for r in here]
        transient = [r.transient for r in here]
        outside = outside_allocator(recipe, [r.role for r in here], traits=traits)
        graph_pool = max((r.activations for r in here if r.graphed), default=0.0)
        peak = (None if None in resident or None in transient
                else sum(resident) + graph_pool + max(transient) + outside)  # type: ignore[arg-type]
        if peak is not None and card is not None and traits.wakes_beside_cache:
            peak = max(peak, _wake_beside_training(here, card, sum(resident) + graph_pool + outside))  # type: ignore[arg-type]
        gpus.append(GpuMemory(g, tuple(r.role for r in here), peak, card, outside,
                              any(r.engine_short for r in here)))
    return MemoryEstimate(roles, gpus)


def _wake_beside_training(here: list[RoleMemory], card: float, held: float) -> float:
    """A GPU's peak when a sleeping engine wakes beside training's cached blocks (``held``: the resident states, the
    graphs' pool and the memory outside the allocator), or 0 where the trainer would hand those blocks back first
    because the engine's pool would not fit beside them."""
    from tunekit.trainer.rollout.vllm_engine import must_empty_cache

    engine = sum(r.engine or 0.0 for r in here if r.engine_sleeps)
    cached = max((r.transient or 0.0 for r in here if r.role != "rollout"), default=0.0)
    if not engine or not cached or must_empty_cache(int(card - held - cached), int(engine)):
        return 0.0
    return held + cached + engine


def model_shape(recipe: Recipe) -> ModelShape:
    """The policy's shapes from its config alone (no weights read)."""
    from tunekit.workload import models

    return ModelShape(**models.memory_shape(recipe.model.path, recipe.model.preset, recipe.model.trust_remote_code))


def summary_fields(est: MemoryEstimate) -> dict[str, float | None]:
    """What a probe's summary records of the estimate (GiB, as ``perf/max_memory_reserved_gb``): the fullest GPU's
    peak, each GPU's (by device-map index) and the card."""
    card = est.gpus[0].card if est.gpus else None
    out = {"memory/estimate_gb": None if est.peak is None else est.peak / GIB,
           "memory/card_gb": None if card is None else card / GIB}
    for g in est.gpus:
        out[f"memory/estimate_gb/{g.gpu}"] = None if g.peak is None else g.peak / GIB
    return out


def measured_peak(summary: dict) -> float | None:
    """The fullest GPU's measured peak (GiB) as the estimate counts it: the probe's own share of the card where NVML
    names its processes (``nvml/own_mem_used_gb/<gpu>``: another job on the card does not count), else NVML's used
    memory (every process on the GPU); None without NVML (the allocator's peak misses what lies outside it)."""
    for prefix in (metrics.nvml_own_mem_used(""), metrics.nvml_mem_used("")):
        nvml = [float(v) for k, v in summary.items()
                if k.startswith(prefix) and isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nvml:
            return max(nvml)
    return None


def estimate_error(estimate_gb: float | None, measured_gb: float | None) -> float | None:
    """(estimate - measured) / measured: below 0 the estimate was low; None when either is missing."""
    if estimate_gb is None or not measured_gb:
        return None
    return (estimate_gb - measured_gb) / measured_gb


def error_fields(summary: dict) -> dict[str, float | None]:
    """What a probe's summary records beside the estimate: ``memory/measured_gb`` (the fullest GPU's NVML peak)
    and ``memory/estimate_error`` (relative, from the fullest GPU's estimate)."""
    measured = measured_peak(summary)
    return {"memory/measured_gb": measured,
            "memory/estimate_error": estimate_error(summary.get("memory/estimate_gb"), measured)}


def headroom(summary: dict) -> list[tuple[str, float, float]]:
    """(GPU, measured peak GiB, card GiB) per GPU of a probe's summary: NVML's peak per GPU (every process, a vLLM
    engine included), else the trainer's allocator peak; empty without a known card."""
    card = summary.get("memory/card_gb")
    if card is None:
        return []
    nvml = {k.rsplit("/", 1)[1]: float(v) for k, v in summary.items()
            if k.startswith("nvml/mem_used_gb/") and isinstance(v, (int, float))}
    if nvml:
        return [(gpu, peak, float(card)) for gpu, peak in sorted(nvml.items())]
    reserved = (summary.get("steady") or {}).get(metrics.MAX_RESERVED_GB)
    return [("allocator", float(reserved), float(card))] if reserved is not None else []


def headroom_lines(summary: dict) -> list[tuple[str, str]]:
    """(GPU, one line) per GPU of :func:`headroom`: the memory left free, the peak against the card, and the
    estimate beside it: what ``tunekit probe`` and the report show."""
    rows = headroom(summary)
    out = []
    for gpu, peak, card in rows:
        # the GPU's own estimate where the summary has one under its index, else the fullest GPU's for a one-GPU probe
        estimate = summary.get(f"memory/estimate_gb/{gpu}", summary.get("memory/estimate_gb") if len(rows) == 1 else None)
        est = f", estimated {estimate:.1f} GiB" if estimate is not None else ""
        out.append((gpu, f"{card - peak:.1f} GiB free: peak {peak:.1f} of {card:.0f} GiB ({peak / card:.0%}){est}"))
    return out


KV_IDLE = 0.5
"""Below this share of its KV cache in use at the fullest, an engine holds memory its rollouts never needed."""


def kv_cache_fields(steps, warmup: int) -> dict[str, float]:
    """What a probe's summary records of its engine's KV cache over the steps past ``warmup``:
    ``rollout/kv_usage_peak`` (the fullest the cache was, 0 to 1) and ``rollout/preemptions`` (requests evicted for
    lack of it, a step on average); empty where the rollout records neither (HF generate)."""
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps
    out = {}
    for key, agg in ((metrics.KV_USAGE_PEAK, "max"), (metrics.PREEMPTIONS, "mean")):
        if key in steady and steady[key].notna().any():
            out[key] = float(steady[key].agg(agg))
    return out


def kv_verdict(summary: dict) -> str | None:
    """One sentence on a probe's engine KV cache (:func:`kv_cache_fields`): memory-starved, mostly idle, or sized to
    its load; None without the record."""
    peak, preempted = summary.get(metrics.KV_USAGE_PEAK), summary.get(metrics.PREEMPTIONS)
    if peak is None:
        return None
    if preempted:
        return (f"memory-starved: {preempted:.3g} requests preempted a step, the KV cache {peak:.0%} full at its fullest; "
                "give the engine more memory (system.rollout.gpu_memory_utilization) or fewer sequences at once "
                "(system.rollout.max_num_seqs)")
    if peak < KV_IDLE:
        return (f"{1 - peak:.0%} of the KV cache idle at its fullest ({peak:.1%} used, no preemptions): the engine "
                "would do with a smaller system.rollout.gpu_memory_utilization (memory it holds while awake)")
    return f"the KV cache {peak:.0%} full at its fullest, no preemptions"


def would_not_fit(recipe: Recipe, card_gib: float | None, *, traits: RunnerTraits) -> str | None:
    """Why ``recipe`` (its runner's ``traits``) cannot fit on cards of ``card_gib`` GiB (one sentence), or None when it
    may (or the card is unknown)."""
    est = estimate_memory(recipe, model_shape(recipe), card_gib, traits=traits)
    worst = [g for g in est.gpus if g.verdict == "would not fit"]
    if not worst:
        return None
    short = [g for g in worst if g.engine_short]
    if short:
        engine = next(r for r in est.roles if r.engine_short)
        return (f"would not fit: the rollout engine's weights on GPU {short[0].gpu} take an estimated "
                f"{engine.engine_weights / GIB:.3g} GiB, more than its pool of {(engine.engine or 0) / GIB:.3g} GiB "
                "(gpu_memory_utilization x card); raise system.rollout.gpu_memory_utilization or "
                "tensor_parallel_size")
    g = max(worst, key=lambda x: x.peak or 0.0)
    return (f"would not fit: GPU {g.gpu} ({', '.join(g.roles)}) needs an estimated {(g.peak or 0) / GIB:.3g} GiB "
            f"of {card_gib:.3g} GiB")
