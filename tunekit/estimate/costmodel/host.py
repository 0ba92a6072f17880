"""Fixed costs a step pays whatever its FLOPs and bytes: the host issuing work, and each kernel on the device.

A small model on a large GPU lives in this regime: a 135M-parameter decode step of 512 sequences reads 0.3 GB
(60 us on an H200) while the engine spends milliseconds scheduling it and turning its tokens into Python objects,
and a training pass of hidden width 576 runs thousands of kernels of a few microseconds each. These are the stated
costs of that regime, one home for all of them; each says where its number comes from. They are the host's and the
software's (the CPU, the driver, PyTorch, vLLM) more than the GPU's, so no price profile carries them; a faster host
lowers them. A calibration fits what its probes show beyond them (``launch_s``, ``pass_s``).
"""

from __future__ import annotations

import math

EAGER_OP_S = 10e-6
"""Host time to issue one eager PyTorch operation on a CUDA tensor: the Python call, the dispatcher, autograd's
bookkeeping and ``cudaLaunchKernel`` (1-3 us of it). Published breakdowns of that path put it at 5-25 us an op.
The eager forward block passes calibrated on an H200 (``benchmarks/results/estimator_check.json``: 1.0-1.3 ms each for the
Qwen2.5 presets, whose Hugging Face blocks run some tens of operations) are of that order."""

KERNEL_S = 2e-6
"""Device time every kernel takes beyond its work, even replayed back to back from a CUDA graph: its start on the
device, the ramp of its first wave and the drain of its last; a kernel that does almost nothing still holds the
GPU a few microseconds (NVIDIA's introduction to CUDA graphs, developer.nvidia.com/blog/cuda-graphs, times chains
of such kernels). It dominates where kernels are small: the elementwise and matmul kernels of a model a few hundred
wide. A stated value: a calibration cannot tell it from the matmul efficiency."""

BLOCK_KERNELS = {"eager": (30, 90), "compiled": (12, 36), "graphs": (12, 36)}
"""Kernels one decoder block runs on a training path, forward alone and forward with backward (the backward about
twice the forward's): eager, two RMSNorms of five or six kernels each, the rotary embedding's half a dozen, seven
matmuls, attention, the residual adds and the MLP gate; compiled (Inductor), the seven matmuls, attention and four
or five fused elementwise kernels. A recomputed forward (gradient checkpointing) adds a forward's."""

EAGER_BLOCK_S = {"forward": 1.0e-3, "update": 3.5e-3, "recompute": 3.3e-3}
"""Host time an eager training pass spends per decoder block on a GPU, the forward alone and the forward with its
backward: Hugging Face's block modules, their hooks and autocast's casts, and autograd's bookkeeping, far above
what :data:`EAGER_OP_S` per kernel of :data:`BLOCK_KERNELS` would make (0.3 and 0.9 ms). The launch costs fitted on
an H200 over the Qwen2.5 presets (``benchmarks/results/estimator_check.json``: 0.99-1.16 ms a forward block pass, 3.5-4.6 ms
an update's); a calibration fits what its probes show beyond them. A compiled pass's host cost per block is left to
the calibration.

``recompute``: what a checkpointed block adds to its update (gradient checkpointing): its forward run again inside
the backward under ``torch.utils.checkpoint``, whose saved-tensor hooks, kept and restored RNG state and second
autograd graph cost three times a plain forward's host time. Two probes of the Qwen2.5-0.5B preset on an H200 that
differ only in checkpointing (``benchmarks/results/projection_fidelity.json``: eager, one
micro-batch of 24 blocks a step) updated in 0.171 and 0.251 s: 3.3 ms a block."""

ENGINE_STEP_S = 2e-3
"""vLLM: host time of one engine step whatever its batch: the scheduler's pass, the model runner's input
preparation, the forward's launch (one CUDA graph replay), the sampler's fixed kernels and the wait for the sampled
tokens. tunekit's loadtest of SmolLM2-135M on an H200 (``benchmarks/results/loadtest_gpu.json``) decodes at 2.1-2.6 ms a token
with one request in flight through the server, where the GPU's share of such a step is under 0.1 ms; vLLM's
multi-step RFC (vllm-project/vllm#6854) measured 4-5 ms of GPU idle between the decode steps of its V0 engine."""

ENGINE_SEQUENCE_S = 12e-6
"""vLLM: host time per sequence in flight per engine step, beside :data:`SEEDED_DRAW_OPS`: the scheduler's
per-request bookkeeping and its update from the step's output (about 1 us each at 256 requests,
vllm-project/vllm#46112's microbenchmark), the model runner's per-request state, the output processor appending the
token and building its logprob object. The RFC above attributes its idle gaps to the same per-request Python."""

SEEDED_DRAW_OPS = 2
"""vLLM's sampler draws the exponential noise of a request that carries its own seed row by row, with that request's
generator (an index and an ``exponential_``: two eager operations a sequence a step). tunekit's trainers seed every
row, so a step is reproducible."""

ENGINE_REQUEST_OPS = 10
"""Eager operations' worth of host time a request costs once: vLLM's input processor (parameters checked, the
request built and queued), its final output, and the trainer turning it into tensors (tokens and logprobs, one row
each)."""

ENGINE_BLOCK_OPS = 12
"""Operations an eager vLLM engine (``enforce_eager``) launches one decoder block at a time in a decode step: the
fused norms, the QKV, output, gate-up and down projections, the rotary embedding, the KV-cache write and the
attention, the activation."""

ENGINE_POOL_S_PER_GIB = 1e-3
"""Seconds a colocated engine's sleep (level 2: its pool released) and again its wake (mapped back) take per GiB of
its memory pool: vLLM's own log lines time each, 0.026-0.050 s for a 42 GiB pool on an H200."""

WEIGHT_TENSOR_OPS = 5
"""Eager operations loading one tensor into an in-process engine costs: the cast to the engine's dtype, vLLM's
``load_weights`` finding its parameter (a stacked QKV or gate-up shard by name) and its ``weight_loader`` narrowing
and copying into it."""

CHAT_TEMPLATE_S = 60e-6
"""Host time to render one prompt through a chat template (transformers' ``apply_chat_template``, a Jinja
template), which the trainer does for every row of a step: 62 us a row on a 2-core AMD EPYC development host
(SmolLM2-135M-Instruct's template around a one-line question)."""

TOKEN_S = 1e-6
"""Host time a fast (Rust) tokenizer takes per token, encoding a step's prompts or decoding its responses for the
reward: 0.7-1.8 us a token on the same host (rows of 10 to 690 tokens, 512 at a time)."""

PASS_OPS = 40
"""Eager operations a training micro-batch runs outside the model's blocks: slicing the batch, the loss and its
weighting, ``backward``'s entry, the gradients' accumulation (one ``foreach`` call) and the statistics kept."""


def engine_steps(*, rows: float, prompt: float, new: float, waves: int, batched_tokens: int) -> float:
    """Engine steps of a generation: the prefill in chunks of ``batched_tokens`` tokens, then ``new`` decode
    steps per wave of sequences."""
    return math.ceil(rows * prompt / batched_tokens) + waves * new


def engine_terms(*, rows: float, prompt: float, new: float, waves: int, batched_tokens: int, layers: int,
                 eager: bool, sampled: float) -> dict[str, float]:
    """Host seconds a vLLM engine spends generating ``rows`` sequences of up to ``new`` tokens, by term: its steps
    (``new`` decode steps a wave: the longest sequence sets them), the sequences in flight at each decode step (each
    row for the ``sampled`` tokens it draws on average), the requests, and with ``eager`` every decoder block of every
    step launched from the host."""
    steps = engine_steps(rows=rows, prompt=prompt, new=new, waves=waves, batched_tokens=batched_tokens)
    terms = {"engine steps": steps * ENGINE_STEP_S,
             "sequences in flight": rows * sampled * (ENGINE_SEQUENCE_S + SEEDED_DRAW_OPS * EAGER_OP_S),
             "requests": rows * ENGINE_REQUEST_OPS * EAGER_OP_S}
    if eager:
        terms["eager blocks"] = waves * new * layers * ENGINE_BLOCK_OPS * EAGER_OP_S
    return terms


def prompt_terms(*, rows: float, prompt: float, templated: bool) -> dict[str, float]:
    """Host seconds preparing ``rows`` prompts of ``prompt`` tokens for generation: each rendered through the chat
    template (``templated``) and tokenized."""
    terms = {"prompts tokenized": rows * prompt * TOKEN_S}
    if templated:
        terms["chat template"] = rows * CHAT_TEMPLATE_S
    return terms


def pool_s(gib: float) -> float:
    """Seconds a colocated engine takes to sleep, or to wake, with a pool of ``gib`` GiB."""
    return gib * ENGINE_POOL_S_PER_GIB


def weight_load_s(tensors: int) -> float:
    """Host seconds to load ``tensors`` tensors into an in-process engine."""
    return tensors * WEIGHT_TENSOR_OPS * EAGER_OP_S


def kernels_s(block_passes: float, path: str, *, backward: bool, recompute: bool = False) -> float:
    """Device seconds ``block_passes`` decoder-block passes spend in kernels' fixed costs on ``path``
    (:data:`BLOCK_KERNELS`, :data:`KERNEL_S`)."""
    forward, both = BLOCK_KERNELS[path]
    per_block = (both + (forward if recompute else 0)) if backward else forward
    return block_passes * per_block * KERNEL_S


def eager_blocks_s(block_passes: float, path: str, *, backward: bool, recompute: bool = False) -> float:
    """Host seconds ``block_passes`` decoder-block passes on ``path`` take to issue beyond their kernels' launches:
    :data:`EAGER_BLOCK_S` on the eager path, none stated on the compiled ones; a recomputed forward (gradient
    checkpointing) adds its ``recompute``."""
    if path != "eager":
        return 0.0
    forward, both = EAGER_BLOCK_S["forward"], EAGER_BLOCK_S["update"]
    per_block = (both + (EAGER_BLOCK_S["recompute"] if recompute else 0.0)) if backward else forward
    return block_passes * per_block


def pass_host_s(passes: float) -> float:
    """Host seconds ``passes`` training micro-batches spend outside the model's blocks (:data:`PASS_OPS`)."""
    return passes * PASS_OPS * EAGER_OP_S


def model_tensors(layers: int) -> int:
    """Parameter tensors of a decoder model: nine a block (four attention projections, three MLP ones, two norms),
    the embedding, the final norm and an LM head (tied or not, the engine loads one)."""
    return 9 * layers + 3
