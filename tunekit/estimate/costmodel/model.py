"""What one training step asks of the hardware, phase by phase: FLOPs, bytes and host-bound launches.

Each phase becomes a :class:`PhaseWork`: ``ideal_s``, its matmul (or decode) work at the hardware's peak (the part a
phase efficiency divides), ``stream_s``, the elementwise traffic of a training-side pass already priced at the stated
``stream`` share of the HBM bandwidth, ``offset_s``, parts priced at fixed stated efficiencies (prefill compute,
collectives, host transfers, the optimizer step), ``launches``, decoder-block passes, and ``passes``, passes of the
whole model (a decode step of the batch, a micro-batch's forward, or forward and backward), whose host-side costs a
calibration may fit: a pass also launches what lies outside the blocks (embedding, LM head, sampling or the loss),
which a shallow model shows. Every count is for the busiest GPU of the role that runs the phase:

- generation: prefill ``2 N`` FLOPs a prompt token; decode, per step, the bf16 weights read once for the whole
  batch plus the KV cache of every sequence in flight (``2 x layers x kv_dim`` bf16 values a token of context),
  or ``2 N`` FLOPs a generated token where that is larger (a roofline per step); a vLLM engine decodes
  ``max_num_seqs`` sequences at a time, in waves; with tensor parallelism each GPU of a replica reads 1/TP of
  the weights and KV cache and all-reduces the hidden state twice a layer;
- log-probabilities (ref, old) and values, the training side: matmul FLOPs, ``2 x`` the blocks' matmul weights
  (:func:`block_matmul_params`) a token, plus ``2 x vocab x hidden`` a response token for the LM head (the trainer
  runs the head on the response positions only; the critic has none); the update ``3 x`` a forward's per epoch,
  ``4 x`` with gradient checkpointing (the forward again). Beside them the bytes eager elementwise kernels move
  (:func:`stream_bytes`): per token and block, norms, rotary embedding, residual adds and the MLP's gate; per
  response token, the float32 log-probability over the vocabulary; the backward ``STREAM_BACKWARD`` x the forward's;
  per micro-batch of an update, each gradient added into its fp32 accumulator. The attention scores' FLOPs
  (``4 x context x hidden`` a token and layer, under 1% at these lengths) and the entropy bonus's extra softmax
  are left out;
- FSDP2 across ``n`` GPUs, per micro-batch: bf16 all-gathers of the parameters (forward, and backward again when
  resharded after forward) and an fp32 reduce-scatter of the gradients, ``(n - 1) / n`` of each over the
  GPU-to-GPU link; parameter offload moves the fp32 shard and its gradients over the host link;
- weight sync: the actor's bf16 weights, gathered across its GPUs and copied into the engine (device memory),
  broadcast to a server on GPUs of its own (GPU link), or through host memory (a Ray object store).

The training passes run eager, compiled, or compiled and replayed as CUDA graphs (:func:`training_path`); each
path is its own efficiency group (``update_actor``, ``update_actor/compiled``, ``update_actor/graphs``, and so for
``forward`` and ``update_critic``), as each rollout backend is: a compiled pass moves :data:`COMPILED_STREAM` of the
eager elementwise traffic, and a replayed one launches no kernel from the host block by block (its host cost is
the model pass's).

A matmul-bound pass of a larger model moves fewer elementwise bytes per FLOP (``hidden`` grows the FLOPs
quadratically, the traffic linearly), so its time per FLOP falls with size at one fitted matmul efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.placement.backends import backend_of
from tunekit.estimate.memory import ModelShape, prompt_tokens
from tunekit.estimate.profiles import PriceProfile

BF16, FP32 = 2, 4
VLLM_MAX_NUM_SEQS = 256
"""Sequences a vLLM engine schedules at once when ``max_num_seqs`` is unset (the model's assumption)."""

DEFAULT_EFFICIENCY: dict[str, float] = {
    "prefill": 0.5, "gen/hf": 0.3, "gen/vllm": 0.6, "gen/vllm_server": 0.6, "forward": 0.5,
    "update_actor": 0.5, "update_critic": 0.5, "sync/hf": 0.5, "sync/vllm": 0.5, "sync/vllm_server": 0.5,
    "comm": 0.7, "host": 0.7, "stream": 0.55,
}
"""Shares of the peak (FLOP/s for compute, bandwidth for bytes) each phase reaches when no probe says otherwise.
``forward`` is every training-side forward without gradients (ref and old log-probabilities, the critic's values);
``update_*`` and ``forward`` divide matmul FLOPs only. ``prefill``, ``comm`` (collectives), ``host`` (host transfers
and the optimizer step) and ``stream`` are never fitted: ``stream`` is the share of the HBM bandwidth eager
elementwise, copy and reduction kernels reach on the bytes :func:`stream_bytes` counts, a stated value: the
calibration probes, one work-bound, cannot tell it from the matmul efficiency."""
TRAINING_GROUPS = ("forward", "update_actor", "update_critic")
"""The efficiency groups of the training passes, each split by :func:`training_path` (:func:`training_group`)."""
COMPILED_STREAM = 0.35
"""Share of the eager elementwise traffic (:func:`stream_bytes`, the gradient accumulation aside) a compiled pass
still moves: Inductor fuses the norms, the rotary embedding, the residual adds, the MLP gate and the
log-probability into fewer kernels, each reading its inputs and writing its outputs once; a stated value, which the
calibration cannot tell from the matmul efficiency either. The accumulation of each gradient into its fp32 master
stays eager kernels, counted whole."""
STREAM_HIDDEN, STREAM_KV, STREAM_MLP = 108, 20, 10
"""Bytes eager kernels read and write a token in one decoder block's forward, per unit of hidden, key/value and MLP
width: two RMSNorms in float32 (cast, square, mean, scale, cast back, weight: 36 bytes each), the rotary embedding
of queries and keys (20), the attention output's copy back to [tokens, hidden] (4), two residual adds (6 each); the
MLP's SiLU and gate product (10 a unit of its width)."""
STREAM_HEAD_FORWARD, STREAM_HEAD_BACKWARD = 38, 54
"""Bytes a response token's log-probability moves per vocabulary entry: the bf16 logits cast to float32, divided by
the temperature and reduced by ``logsumexp`` (max, subtract, exp, sum: 38); its backward (the softmax from the
saved logits, the division's and the cast's gradients, the picked label's gradient added in: 54)."""
STREAM_BACKWARD = 2.0
"""A block's backward elementwise traffic over its forward's (each kernel's gradient reads its saved input and the
incoming gradient and writes one or two gradients)."""
GRAD_ACCUMULATE = 10
"""Bytes a parameter a micro-batch of an update: its bf16 gradient read and added into the fp32 accumulator."""
DEFAULT_STARTUP_S = 60.0
"""A run's fixed cost (process start, model and engine build) when no probe measured one."""


@dataclass(frozen=True)
class Hardware:
    """One GPU's peaks, in FLOP/s and bytes/s."""

    name: str
    flops: float
    hbm: float
    link: float
    host: float
    overlap: bool = True
    """The device runs kernels while the host issues the next ones (a GPU): a phase takes the longer of its launches
    and its work, not their sum. A CPU does both itself, one after the other."""


def hardware(profile: PriceProfile) -> Hardware:
    """The profile's peaks; a ConfigError naming the profile and the key when one the model needs is null."""
    for key in ("peak_bf16_tflops", "hbm_bandwidth_gbs", "interconnect_gbs", "host_link_gbs"):
        if getattr(profile, key) is None:
            raise ConfigError(f"price profile {profile.name!r} has no {key} (null), which the cost model needs; add the "
                              "GPU's value from its datasheet to the profile or pick another with --gpu-profile.")
    return Hardware(profile.name, profile.peak_bf16_tflops * 1e12, profile.hbm_bandwidth_gbs * 1e9,  # type: ignore[operator]
                    profile.interconnect_gbs * 1e9, profile.host_link_gbs * 1e9,  # type: ignore[operator]
                    overlap=profile.nvml_pattern is not None)  # a GPU (NVML names it); a CPU card never matches


@dataclass(frozen=True)
class PhaseWork:
    group: str
    """The efficiency that divides ``ideal_s`` (a key of :data:`DEFAULT_EFFICIENCY`)."""
    ideal_s: float
    offset_s: float = 0.0
    launches: float = 0.0
    passes: float = 0.0
    stream_s: float = 0.0
    """Elementwise traffic at the stated ``stream`` efficiency: device work beside ``ideal_s``, that no fitted
    efficiency divides."""

    def seconds(self, efficiency: float, launch_s: float = 0.0, overlap: bool = False, pass_s: float = 0.0) -> float:
        """``offset_s`` plus the device's work (``ideal_s`` at ``efficiency``, and ``stream_s``) and the host's
        launches (``launch_s`` a block pass, ``pass_s`` a model pass): the longer of the two where the device overlaps
        them with the host (:attr:`Hardware.overlap`), else their sum."""
        work = (self.ideal_s / efficiency if self.ideal_s else 0.0) + self.stream_s
        launches = self.launches * launch_s + self.passes * pass_s
        return self.offset_s + (max(work, launches) if overlap else work + launches)


# ---------------------------------------------------------------- pure counts


def decode_bytes(*, n_params: float, kv_bytes_per_token: float, rows: float, prompt: float, new: float, waves: int) -> float:
    """Bytes a batch's decode reads: the weights once per step of each wave, and every sequence's KV cache of its
    context so far at every step (``rows x sum over steps of prompt + step``)."""
    context = rows * (new * prompt + new * (new + 1) / 2)
    return waves * new * BF16 * n_params + kv_bytes_per_token * context


def fsdp_bytes(n_params: float, gpus: int, *, gathers: int, reduce: bool) -> float:
    """Bytes one GPU sends for one FSDP2 pass: ``gathers`` bf16 all-gathers of the parameters and, with ``reduce``,
    an fp32 reduce-scatter of the gradients, ``(n - 1) / n`` of each (ring); 0 on one GPU."""
    if gpus <= 1:
        return 0.0
    return (gathers * BF16 + (FP32 if reduce else 0)) * n_params * (gpus - 1) / gpus


def block_matmul_params(shape: ModelShape) -> float:
    """Weights the decoder blocks multiply a token by: queries and output ``hidden x hidden`` each, keys and values
    ``hidden x kv_dim`` each, the MLP's gate, up and down ``hidden x intermediate`` each, per layer (norms and
    biases, under 0.1%, left out)."""
    h = shape.hidden
    return shape.n_layers * (2 * h * (h + shape.kv_dim) + 3 * h * shape.intermediate)


def pass_flops(shape: ModelShape, *, tokens: float, head_tokens: float, passes: float) -> float:
    """Matmul FLOPs of ``passes`` forwards' worth (1 a forward, 3 forward and backward, 4 with the forward
    recomputed) over ``tokens`` tokens, ``head_tokens`` of which go through the LM head."""
    return passes * 2 * (block_matmul_params(shape) * tokens + shape.vocab * shape.hidden * head_tokens)


def stream_bytes(shape: ModelShape, *, tokens: float, head_tokens: float, backward: bool, blocks_forward: int = 1) -> float:
    """Bytes eager elementwise kernels move over ``tokens`` tokens: each block's forward ``blocks_forward`` times
    (2 with the forward recomputed) and, with ``backward``, its backward; the log-probability of ``head_tokens``
    response tokens over the vocabulary, and its backward (:data:`STREAM_HIDDEN`, :data:`STREAM_HEAD_FORWARD`)."""
    block = STREAM_HIDDEN * shape.hidden + STREAM_KV * shape.kv_dim + STREAM_MLP * shape.intermediate
    per_token = shape.n_layers * block * (blocks_forward + (STREAM_BACKWARD if backward else 0.0))
    head = STREAM_HEAD_FORWARD + (STREAM_HEAD_BACKWARD if backward else 0)
    return per_token * tokens + head * shape.vocab * head_tokens


# ---------------------------------------------------------------- phases of a recipe


Resolve = Callable[[Recipe, bool], dict[str, bool]]
"""What a recipe's runner resolves its training path to on a GPU or not (``tunekit.runners.resolve_training``)."""


def training_path(recipe: Recipe, *, gpu: bool, resolve: Resolve, resolved: dict | None = None) -> str:
    """How the training passes run: ``graphs`` (compiled and replayed as CUDA graphs), ``compiled`` or ``eager``.
    ``resolved``: a probe's summary, which records what its runner resolved (``resolved/compile``,
    ``resolved/cuda_graphs``); without it, what ``resolve`` says the recipe's runner resolves on a GPU (``gpu``) or
    not."""
    if not resolved or "resolved/compile" not in resolved:
        resolved = resolve(recipe, gpu)
    if not resolved.get("resolved/compile"):
        return "eager"
    return "graphs" if resolved.get("resolved/cuda_graphs") else "compiled"


def training_group(group: str, path: str) -> str:
    """The efficiency group of a training pass on ``path`` (the eager one keeps the plain name)."""
    return group if path == "eager" else f"{group}/{path}"


def eager_group(group: str) -> str:
    """The eager group of a training pass's group on any path (other groups are their own)."""
    base = group.split("/", 1)[0]
    return base if base in TRAINING_GROUPS else group


def default_efficiency(group: str) -> float:
    """The stated efficiency of ``group`` (:data:`DEFAULT_EFFICIENCY`; a training path takes its eager group's: the
    same matmul kernels)."""
    return DEFAULT_EFFICIENCY[eager_group(group)]


def _gpus(recipe: Recipe, role: str) -> int:
    return max(1, len(recipe.system.device_map.get(role) or []))


def phases(recipe: Recipe, shape: ModelShape, hw: Hardware, eff: dict[str, float] | None = None, *,
           path: str = "eager") -> dict[str, PhaseWork]:
    """Every phase a step of ``recipe`` runs, by its ``timing_s/<phase>`` name; ``eff`` sets the fixed efficiencies
    (``prefill``, ``comm``, ``host``; default :data:`DEFAULT_EFFICIENCY`); ``path``: how its training passes run
    (:func:`training_path`)."""
    e = DEFAULT_EFFICIENCY | (eff or {})
    s, b, t, algo = recipe.system, recipe.system.batch, recipe.task, recipe.algorithm
    n = float(shape.n_params)
    head = float(shape.vocab * shape.hidden)
    prompt, new = float(prompt_tokens(recipe)), float(t.max_new_tokens)
    link = lambda nbytes: nbytes / (hw.link * e["comm"])  # noqa: E731
    stream = lambda nbytes: nbytes / (hw.hbm * e["stream"])  # noqa: E731
    fused = 1.0 if path == "eager" else COMPILED_STREAM
    blocks = lambda passes: 0.0 if path == "graphs" else passes * shape.n_layers  # noqa: E731  host launches
    out = {"gen": _gen(recipe, shape, hw, e, prompt, new, link)}
    rows = lambda role: b.samples_per_step / _gpus(recipe, role)  # noqa: E731
    micro = lambda role: math.ceil(rows(role) / b.micro_batch)  # noqa: E731

    def forward(role: str, lm_head: bool) -> PhaseWork:
        g, tokens, response = _gpus(recipe, role), rows(role) * (prompt + new), rows(role) * new if lm_head else 0.0
        comm = micro(role) * fsdp_bytes(n, g, gathers=1, reduce=False)
        flops = pass_flops(shape, tokens=tokens, head_tokens=response, passes=1)
        moved = fused * stream_bytes(shape, tokens=tokens, head_tokens=response, backward=False)
        return PhaseWork(training_group("forward", path), flops / hw.flops, link(comm), blocks(micro(role)), micro(role),
                         stream(moved))

    def update(role: str, lm_head: bool) -> PhaseWork:
        g, mem = _gpus(recipe, role), s.memory
        passes = micro(role) * algo.ppo_epochs
        params = n if lm_head else n - head
        comm = passes * fsdp_bytes(n, g, gathers=2 if mem.reshard_after_forward else 1, reduce=True)
        host = passes * 2 * FP32 * n / g if mem.param_offload else 0.0  # the fp32 shard in, its gradients out
        adam = 0.0 if mem.param_offload else 7 * FP32 * n / g / (hw.hbm * e["host"])  # read 4, write 3 fp32 tensors
        tokens = rows(role) * (prompt + new) * algo.ppo_epochs
        response = rows(role) * new * algo.ppo_epochs if lm_head else 0.0
        ckpt = mem.gradient_checkpointing
        flops = pass_flops(shape, tokens=tokens, head_tokens=response, passes=4 if ckpt else 3)
        moved = fused * stream_bytes(shape, tokens=tokens, head_tokens=response, backward=True,
                                     blocks_forward=2 if ckpt else 1)
        moved += passes * GRAD_ACCUMULATE * params / g
        return PhaseWork(training_group(f"update_{role}", path), flops / hw.flops,
                         link(comm) + host / (hw.host * e["host"]) + adam, blocks(passes), passes, stream(moved))

    if algo.uses_ref:
        out["ref"] = forward("ref", lm_head=True)
    bb = b.mini_batch < b.samples_per_step
    if algo.ppo_epochs > 1 or bb or algo.kl_in_reward:  # the trainer's own rule for an old_logprob pass
        out["old_logprob"] = forward("actor", lm_head=True)
    if algo.uses_critic:
        out["values"] = forward("critic", lm_head=False)
        out["update_critic"] = update("critic", lm_head=False)
    out["update_actor"] = update("actor", lm_head=True)
    out["update_weights"] = _sync(recipe, n, hw, e, link)
    return out


def _gen(recipe: Recipe, shape: ModelShape, hw: Hardware, e: dict[str, float], prompt: float, new: float, link) -> PhaseWork:
    s, rc = recipe.system, recipe.system.rollout
    gpus = _gpus(recipe, "rollout") if s.device_map.get("rollout") else 1
    tp = rc.tensor_parallel_size
    rows = recipe.system.batch.samples_per_step / max(1, gpus // tp)  # per replica of tp GPUs
    n = float(shape.n_params) / tp  # each GPU of a replica holds 1/tp of the weights and of the KV cache
    spec = backend_of(rc)
    waves = 1 if spec.generates_with_policy else math.ceil(rows / (rc.max_num_seqs or VLLM_MAX_NUM_SEQS))
    kv = shape.n_layers * 2 * shape.kv_dim * BF16 / tp
    nbytes = decode_bytes(n_params=n, kv_bytes_per_token=kv, rows=rows, prompt=prompt, new=new, waves=waves)
    ideal = max(nbytes / hw.hbm, 2 * n * rows * new / hw.flops)
    offset = 2 * n * rows * prompt / (hw.flops * e["prefill"])
    if tp > 1:  # two all-reduces of the bf16 hidden state per layer and token (attention and MLP outputs)
        offset += link(2 * shape.n_layers * rows * (prompt + new) * shape.hidden * BF16 * 2 * (tp - 1) / tp)
    actor = _gpus(recipe, "actor")
    if spec.generates_with_policy and s.controller == "spmd":  # generate on the actor, sharded over its GPUs
        offset += link(waves * new * fsdp_bytes(n, actor, gathers=1, reduce=False))
    return PhaseWork(f"gen/{rc.backend}", ideal, offset, waves * new * shape.n_layers, waves * new)


def _sync(recipe: Recipe, n: float, hw: Hardware, e: dict[str, float], link) -> PhaseWork:
    s, rc = recipe.system, recipe.system.rollout
    group = f"sync/{rc.backend}"
    actor, rollout = set(s.device_map.get("actor") or [0]), set(s.device_map.get("rollout") or [])
    gather = link(fsdp_bytes(n, len(actor), gathers=1, reduce=False))
    weights = BF16 * n
    spec = backend_of(rc)
    if spec.generates_with_policy:
        if s.controller == "spmd" and rollout <= actor:
            return PhaseWork(group, 0.0)  # generates with the actor's own weights
        return PhaseWork(group, _moved(recipe, weights, hw, actor, rollout), gather)
    if not spec.in_trainer_ranks and (spec.external(rc) or not (rollout - actor)):
        return PhaseWork(group, 0.0)  # a server elsewhere, or one that sleeps on the trainer's GPU: no weights pushed
    return PhaseWork(group, _moved(recipe, weights, hw, actor, rollout), gather)


def _moved(recipe: Recipe, nbytes: float, hw: Hardware, src: set[int], dst: set[int]) -> float:
    """Seconds at peak to move the weights from the actor to the rollout: through host memory (a Ray object
    store), over the GPU link (other GPUs), or a copy in device memory (read and write)."""
    if recipe.system.controller == "single" and recipe.system.weight_sync == "object_store":
        return 2 * nbytes / hw.host
    if dst - src:
        return nbytes / hw.link
    return 2 * nbytes / hw.hbm
