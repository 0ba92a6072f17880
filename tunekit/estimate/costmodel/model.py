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

A small model lives where none of that binds: its phases take the fixed costs of :mod:`~.host` (``host_s`` beside
the launches, stated, and each kernel's fixed time in ``stream_s``), which every GPU pays alike. A vLLM engine's
generation pays its steps, each sequence in flight at each step and each request on the host (every row for every
token of the budget: a response that ends early is not known ahead); a colocated engine that sleeps releases and
maps back its pool (``offset_s``, in ``gen`` and ``update_weights``); loading the weights into an in-process
engine pays per tensor; a training micro-batch pays its bookkeeping and its kernels' fixed time, an optimizer step
its per-tensor calls. ``terms`` names every stated piece, so a table says which one sets a phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.placement.backends import backend_of
from tunekit.estimate.costmodel import host
from tunekit.estimate.memory import ModelShape, prompt_tokens
from tunekit.workload.lengths import templated_prompts
from tunekit.estimate.profiles import PriceProfile
from tunekit.estimate.traits import Rules

BF16, FP32 = 2, 4
VLLM_MAX_NUM_SEQS = 256
"""Sequences a vLLM engine schedules at once when ``max_num_seqs`` is unset, on a GPU under 70 GiB or an A100
(:attr:`Hardware.engine_seqs`)."""

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
    memory_gib: float | None = None

    @property
    def engine_seqs(self) -> int:
        """Sequences a vLLM engine schedules at once when ``max_num_seqs`` is unset: vLLM's default for its ``LLM``
        class and its server, 1024 on a GPU of at least 70 GiB other than an A100, else :data:`VLLM_MAX_NUM_SEQS`
        (``EngineArgs.get_batch_defaults``)."""
        return 1024 if self._large else VLLM_MAX_NUM_SEQS

    @property
    def engine_batched_tokens(self) -> int:
        """Tokens a vLLM engine step takes when ``max_num_batched_tokens`` is unset: 16384 on the GPUs
        :attr:`engine_seqs` calls large, else 8192 (vLLM's ``LLM`` class)."""
        return 16384 if self._large else 8192

    @property
    def _large(self) -> bool:
        return (self.memory_gib or 0) >= 70 and "a100" not in self.name.lower()


def hardware(profile: PriceProfile) -> Hardware:
    """The profile's peaks; a ConfigError naming the profile and the key when one the model needs is null."""
    for key in ("peak_bf16_tflops", "hbm_bandwidth_gbs", "interconnect_gbs", "host_link_gbs"):
        if getattr(profile, key) is None:
            raise ConfigError(f"price profile {profile.name!r} has no {key} (null), which the cost model needs; add the "
                              "GPU's value from its datasheet to the profile or pick another with --gpu-profile.")
    return Hardware(profile.name, profile.peak_bf16_tflops * 1e12, profile.hbm_bandwidth_gbs * 1e9,  # type: ignore[operator]
                    profile.interconnect_gbs * 1e9, profile.host_link_gbs * 1e9,  # type: ignore[operator]
                    overlap=profile.is_gpu,
                    memory_gib=profile.memory_gib)


@dataclass(frozen=True)
class PhaseWork:
    group: str
    """The efficiency that divides ``ideal_s`` (a key of :data:`DEFAULT_EFFICIENCY`)."""
    ideal_s: float
    offset_s: float = 0.0
    launches: float = 0.0
    passes: float = 0.0
    stream_s: float = 0.0
    """Device work at stated costs beside ``ideal_s``, that no fitted efficiency divides: the elementwise traffic
    at the stated ``stream`` efficiency, and on a GPU each kernel's fixed time (:data:`host.KERNEL_S`)."""
    host_s: float = 0.0
    """Stated host time beside the launches a calibration fits (:mod:`~tunekit.estimate.costmodel.host`): an
    engine's scheduling, a training pass's bookkeeping, loading weights; the device works meanwhile."""
    terms: tuple[tuple[str, str, float], ...] = ()
    """The stated pieces of ``offset_s``, ``stream_s`` and ``host_s``: (``serial``, ``device`` or ``host``, name,
    seconds), so a table can say which term sets the phase."""

    def sides(self, efficiency: float, launch_s: float = 0.0, pass_s: float = 0.0) -> tuple[float, float]:
        """(device, host) seconds beside ``offset_s``: ``ideal_s`` at ``efficiency`` and ``stream_s``; the launches
        (``launch_s`` a block pass, ``pass_s`` a model pass) and ``host_s``."""
        work = (self.ideal_s / efficiency if self.ideal_s else 0.0) + self.stream_s
        return work, self.launches * launch_s + self.passes * pass_s + self.host_s

    def seconds(self, efficiency: float, launch_s: float = 0.0, overlap: bool = False, pass_s: float = 0.0) -> float:
        """``offset_s`` plus the device's side and the host's (:meth:`sides`): the longer of the two where the device
        overlaps them with the host (:attr:`Hardware.overlap`), else their sum."""
        work, host = self.sides(efficiency, launch_s, pass_s)
        return self.offset_s + (max(work, host) if overlap else work + host)


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


def training_path(recipe: Recipe, *, gpu: bool, runners: Rules, resolved: dict | None = None) -> str:
    """How the training passes run: ``graphs`` (compiled and replayed as CUDA graphs), ``compiled`` or ``eager``.
    ``resolved``: a probe's summary, which records what its runner resolved (``resolved/compile``,
    ``resolved/cuda_graphs``); without it, what the recipe's runner (``runners``) resolves on a GPU (``gpu``) or
    not."""
    if not resolved or "resolved/compile" not in resolved:
        resolved = runners(recipe).training_path(recipe, gpu=gpu)
    if not resolved.get("resolved/compile"):
        return "eager"
    return "graphs" if resolved.get("resolved/cuda_graphs") else "compiled"


def training_group(group: str, path: str) -> str:
    """The efficiency group of a training pass on ``path`` (the eager one keeps the plain name)."""
    return group if path == "eager" else f"{group}/{path}"


def runner_group(group: str, runner: str) -> str:
    """The efficiency group of a generation or weight sync (``gen/<backend>``, ``sync/<backend>``) driven by
    ``runner``: its own where another framework drives the engine (TRL's and verl's generation add their own host
    work around it: prompts gathered, completions padded and decoded), the plain one under tunekit's trainer."""
    return group if runner == "builtin" else f"{group}/{runner}"


def shared_group(group: str) -> str:
    """The group whose fit and stated efficiency ``group`` falls back to where no probe fitted its own: a training
    pass's eager group on any path (the same matmul kernels), a runner's generation or weight sync the engine's
    under tunekit's trainer (:func:`runner_group`); other groups are their own."""
    base = group.split("/", 1)[0]
    if base in TRAINING_GROUPS:
        return base
    return "/".join(group.split("/")[:2]) if base in ("gen", "sync") else group


def default_efficiency(group: str) -> float:
    """The stated efficiency of ``group`` (:data:`DEFAULT_EFFICIENCY`, by :func:`shared_group`)."""
    return DEFAULT_EFFICIENCY[shared_group(group)]


def _gpus(recipe: Recipe, role: str) -> int:
    return max(1, len(recipe.system.device_map.get(role) or []))


def phases(recipe: Recipe, shape: ModelShape, hw: Hardware, eff: dict[str, float] | None = None, *,
           path: str = "eager", old_logprob: bool | None = None, response: float | None = None) -> dict[str, PhaseWork]:
    """Every phase a step of ``recipe`` runs, by its ``timing_s/<phase>`` name; ``eff`` sets the fixed efficiencies
    (``prefill``, ``comm``, ``host``; default :data:`DEFAULT_EFFICIENCY`); ``path``: how its training passes run
    (:func:`training_path`); ``old_logprob``: whether its runner runs the old policy's forward (what its runner
    resolves as ``resolved/old_logprob``; None: tunekit's trainer's rule); ``response``: the tokens a response
    holds on average, measured by probes of this workload (None: the ``task.max_new_tokens`` budget), which sets
    the per-sequence work of generating and decoding them (the decode steps, the training passes' padded rows and
    the KV cache stay at the budget)."""
    e = DEFAULT_EFFICIENCY | (eff or {})
    s, b, t, algo = recipe.system, recipe.system.batch, recipe.task, recipe.algorithm
    n = float(shape.n_params)
    head = float(shape.vocab * shape.hidden)
    prompt, new = float(prompt_tokens(recipe)), float(t.max_new_tokens)
    sampled = new if response is None or t.fixed_length else min(new, response)
    link = lambda nbytes: nbytes / (hw.link * e["comm"])  # noqa: E731
    stream = lambda nbytes: nbytes / (hw.hbm * e["stream"])  # noqa: E731
    fused = 1.0 if path == "eager" else COMPILED_STREAM
    blocks = lambda passes: 0.0 if path == "graphs" else passes * shape.n_layers  # noqa: E731  host launches
    out = {"gen": _gen(recipe, shape, hw, e, prompt, new, link, sampled)}
    rows = lambda role: b.samples_per_step / _gpus(recipe, role)  # noqa: E731
    micro = lambda role: math.ceil(rows(role) / b.micro_batch)  # noqa: E731
    if hw.overlap:  # the responses decoded to text for the reward function (whose own cost is the user's)
        decode = rows("actor") * sampled * host.TOKEN_S
        out["reward"] = PhaseWork("host", 0.0, host_s=decode, terms=(("host", "responses decoded", decode),))

    def fixed(passes: float, backward: bool, recompute: bool = False, steps: float = 0.0) -> tuple[float, float, tuple]:
        """A GPU's stated (device, host, terms) for ``passes`` micro-batches and ``steps`` optimizer steps: each
        kernel's fixed time, the host's bookkeeping, and per optimizer step the first micro-batch's gradients taken
        tensor by tensor, the clipping and the step."""
        if not hw.overlap:
            return 0.0, 0.0, ()
        kernels = host.kernels_s(passes * shape.n_layers, path, backward=backward, recompute=recompute)
        book = host.pass_host_s(passes)
        opt = steps * host.model_tensors(shape.n_layers) * host.EAGER_OP_S
        eager = host.eager_blocks_s(passes * shape.n_layers, path, backward=backward, recompute=recompute)
        terms = (("device", "kernels' fixed time", kernels), ("host", "eager blocks issued", eager),
                 ("host", "micro-batch bookkeeping", book), ("host", "optimizer steps", opt))
        return kernels, eager + book + opt, tuple(t for t in terms if t[2])

    def forward(role: str, lm_head: bool) -> PhaseWork:
        g, tokens, response = _gpus(recipe, role), rows(role) * (prompt + new), rows(role) * new if lm_head else 0.0
        comm = micro(role) * fsdp_bytes(n, g, gathers=1, reduce=False)
        flops = pass_flops(shape, tokens=tokens, head_tokens=response, passes=1)
        moved = fused * stream_bytes(shape, tokens=tokens, head_tokens=response, backward=False)
        kernels, book, terms = fixed(micro(role), backward=False)
        return PhaseWork(training_group("forward", path), flops / hw.flops, link(comm), blocks(micro(role)), micro(role),
                         stream(moved) + kernels, book, (("device", "elementwise traffic", stream(moved)), *terms))

    def update(role: str, lm_head: bool) -> PhaseWork:
        g, mem = _gpus(recipe, role), s.memory
        passes = micro(role) * algo.ppo_epochs
        params = n if lm_head else n - head
        comm = passes * fsdp_bytes(n, g, gathers=2 if mem.reshard_after_forward else 1, reduce=True)
        offload = passes * 2 * FP32 * n / g if mem.param_offload else 0.0  # the fp32 shard in, its gradients out
        adam = 0.0 if mem.param_offload else 7 * FP32 * n / g / (hw.hbm * e["host"])  # read 4, write 3 fp32 tensors
        tokens = rows(role) * (prompt + new) * algo.ppo_epochs
        response = rows(role) * new * algo.ppo_epochs if lm_head else 0.0
        ckpt = mem.gradient_checkpointing
        flops = pass_flops(shape, tokens=tokens, head_tokens=response, passes=4 if ckpt else 3)
        moved = fused * stream_bytes(shape, tokens=tokens, head_tokens=response, backward=True,
                                     blocks_forward=2 if ckpt else 1)
        moved += passes * GRAD_ACCUMULATE * params / g
        kernels, book, terms = fixed(passes, backward=True, recompute=ckpt,
                                     steps=algo.ppo_epochs * math.ceil(b.samples_per_step / b.mini_batch))
        return PhaseWork(training_group(f"update_{role}", path), flops / hw.flops,
                         link(comm) + offload / (hw.host * e["host"]) + adam, blocks(passes), passes,
                         stream(moved) + kernels, book,
                         (("device", "elementwise traffic", stream(moved)), *terms, ("serial", "AdamW step", adam)))

    if algo.uses_ref:
        out["ref"] = forward("ref", lm_head=True)
    if recipe.recomputes_old_logprobs if old_logprob is None else old_logprob:
        out["old_logprob"] = forward("actor", lm_head=True)
    if algo.uses_critic:
        out["values"] = forward("critic", lm_head=False)
        out["update_critic"] = update("critic", lm_head=False)
    out["update_actor"] = update("actor", lm_head=True)
    out["update_weights"] = _sync(recipe, shape, hw, e, link)
    return out


def _gen(recipe: Recipe, shape: ModelShape, hw: Hardware, e: dict[str, float], prompt: float, new: float, link,
         sampled: float) -> PhaseWork:
    s, rc = recipe.system, recipe.system.rollout
    gpus = _gpus(recipe, "rollout") if s.device_map.get("rollout") else 1
    tp = rc.tensor_parallel_size
    rows = recipe.system.batch.samples_per_step / max(1, gpus // tp)  # per replica of tp GPUs
    n = float(shape.n_params) / tp  # each GPU of a replica holds 1/tp of the weights and of the KV cache
    spec = backend_of(rc)
    waves = 1 if spec.generates_with_policy else math.ceil(rows / (rc.max_num_seqs or hw.engine_seqs))
    kv = shape.n_layers * 2 * shape.kv_dim * BF16 / tp
    nbytes = decode_bytes(n_params=n, kv_bytes_per_token=kv, rows=rows, prompt=prompt, new=new, waves=waves)
    ideal = max(nbytes / hw.hbm, 2 * n * rows * new / hw.flops)
    prefill = 2 * n * rows * prompt / (hw.flops * e["prefill"])
    offset, terms = prefill, [("serial", "prefill", prefill)]
    if tp > 1:  # two all-reduces of the bf16 hidden state per layer and token (attention and MLP outputs)
        offset += link(2 * shape.n_layers * rows * (prompt + new) * shape.hidden * BF16 * 2 * (tp - 1) / tp)
    actor = _gpus(recipe, "actor")
    if spec.generates_with_policy and s.controller == "spmd":  # generate on the actor, sharded over its GPUs
        offset += link(waves * new * fsdp_bytes(n, actor, gathers=1, reduce=False))
    engine = {} if spec.generates_with_policy else host.engine_terms(
        rows=rows, prompt=prompt, new=new, waves=waves, layers=shape.n_layers, eager=rc.enforce_eager,
        batched_tokens=rc.max_num_batched_tokens or hw.engine_batched_tokens, sampled=sampled)
    if hw.overlap:  # the trainer's own host work before the engine sees a prompt
        engine |= host.prompt_terms(rows=recipe.system.batch.samples_per_step / _gpus(recipe, "actor"), prompt=prompt,
                                    templated=templated_prompts(recipe))
    sleep = _pool_s(recipe, shape, hw)
    offset += sleep
    terms += [*(("host", k, v) for k, v in engine.items()), ("serial", "engine sleep", sleep)]
    return PhaseWork(runner_group(f"gen/{rc.backend}", recipe.runner), ideal, offset, waves * new * shape.n_layers, waves * new,
                     host_s=sum(engine.values()), terms=tuple(x for x in terms if x[2]))


def _pool_s(recipe: Recipe, shape: ModelShape, hw: Hardware) -> float:
    """Seconds a colocated in-process engine takes to sleep after generating, or to wake before the weight sync:
    its pool (``gpu_memory_utilization`` of the card) released or mapped back, and at sleep level 1 its bf16
    weights copied over the host link; 0 where it does not sleep."""
    s, rc = recipe.system, recipe.system.rollout
    if not (rc.backend == "vllm" and rc.enable_sleep and hw.memory_gib):
        return 0.0
    if set(s.device_map.get("rollout") or []) - set(s.device_map.get("actor") or [0]):
        return 0.0  # an engine on GPUs of its own stays awake
    parked = BF16 * shape.n_params / rc.tensor_parallel_size / hw.host if rc.sleep_level == 1 else 0.0
    return host.pool_s(rc.gpu_memory_utilization * hw.memory_gib) + parked


def _sync(recipe: Recipe, shape: ModelShape, hw: Hardware, e: dict[str, float], link) -> PhaseWork:
    s, rc = recipe.system, recipe.system.rollout
    n = float(shape.n_params)
    group = runner_group(f"sync/{rc.backend}", recipe.runner)
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
    wake = _pool_s(recipe, shape, hw)
    load = host.weight_load_s(host.model_tensors(shape.n_layers)) if hw.overlap and spec.in_trainer_ranks else 0.0
    terms = tuple(x for x in (("serial", "engine wake", wake), ("host", "tensors loaded", load)) if x[2])
    return PhaseWork(group, _moved(recipe, weights, hw, actor, rollout), gather + wake, host_s=load, terms=terms)


def _moved(recipe: Recipe, nbytes: float, hw: Hardware, src: set[int], dst: set[int]) -> float:
    """Seconds at peak to move the weights from the actor to the rollout: through host memory (a Ray object
    store), over the GPU link (other GPUs), or a copy in device memory (read and write)."""
    if recipe.system.controller == "single" and recipe.system.weight_sync == "object_store":
        return 2 * nbytes / hw.host
    if dst - src:
        return nbytes / hw.link
    return 2 * nbytes / hw.hbm
