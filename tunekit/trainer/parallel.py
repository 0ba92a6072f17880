"""FSDP2 sharding, compilation and the optimizer pieces the roles need (the process group: :mod:`tunekit.placement.dist`).

One function shards a model (``fully_shard`` per decoder block, then the root),
the way torchtitan does. Everything here also runs on CPU over gloo.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.fx.experimental._config as fx_config
from torch import nn

from tunekit.config import MemoryConfig
from tunekit.trainer.optim import bf16_parameters


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face decoder (``model.model.layers`` or ``model.layers``)."""
    for path in ("model.layers", "layers", "backbone.layers", "backbone.model.layers"):
        node = model
        for part in path.split("."):
            node = getattr(node, part, None)
            if node is None:
                break
        if isinstance(node, nn.ModuleList):
            return list(node)
    return []


def shard(model: nn.Module, mem: MemoryConfig, device: torch.device, world: int, *, trainable: bool = True,
          compile: bool = False, cuda_graphs: bool = False) -> nn.Module:
    """Apply FSDP2 to ``model`` (per block, then root) where :meth:`MemoryConfig.shards` says so; otherwise the
    plain module, which on a GPU computes in bf16: a frozen role's weights are cast here; a trained role's by its
    optimizer, which keeps their fp32 masters (:meth:`MemoryConfig.keeps_masters`,
    :func:`tunekit.trainer.optim.adamw`), or with ``master_weights`` off they stay fp32 under bf16 autocast.
    ``compile``: the plain module's whole forward is compiled (:func:`compile_model`), an FSDP2 model's blocks one
    by one (:func:`compile_blocks`); ``cuda_graphs`` (:meth:`SystemConfig.captures`) replays the plain module's
    compiled passes as CUDA graphs."""
    if mem.gradient_checkpointing and trainable and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if is_plain(mem, device, world):
        model.to(device)
        if device.type == "cuda" and not trainable:
            bf16_parameters(model)
        elif device.type == "cuda" and not mem.keeps_masters(gpu=True, world=world):
            autocast_bf16(model, device.type)
        if compile:
            compile_model(model, cuda_graphs=cuda_graphs)
        return model
    if compile:
        compile_blocks(model)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda" else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if mem.param_offload else OffloadPolicy()
    if not mem.param_offload:
        model.to(device)
    kw = dict(reshard_after_forward=mem.reshard_after_forward, mp_policy=mp, offload_policy=offload)
    for block in decoder_layers(model):
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def is_plain(mem: MemoryConfig, device: torch.device, world: int) -> bool:
    """Whether :func:`shard` leaves the model a plain module (:meth:`MemoryConfig.shards`)."""
    return not mem.shards(gpu=device.type == "cuda", world=world)


def autocast_bf16(model: nn.Module, device_type: str) -> nn.Module:
    """``model`` with its forward (and so its backward) under bf16 autocast: fp32 weights and optimizer, bf16
    matmuls, as a one-GPU trainer without FSDP runs. In place, so parameter names do not change."""
    forward = model.forward

    @functools.wraps(forward)
    def under_autocast(*args, **kwargs):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = under_autocast
    return model


def compile_model(model: nn.Module, *, cuda_graphs: bool = False) -> None:
    """torch.compile a plain module's whole forward in place (and so its backward, through AOTAutograd), as a
    one-GPU trainer does with ``model.compile()``: one graph a pass instead of a Python call per operator, which
    is what bounds a small model's update (the GPU waits on the host between kernels). In
    place, so parameter names do not change. The sequence length changes from batch to batch (prompts are
    padded to the longest of each batch), and the batch from micro-batch to micro-batch, so both are dynamic
    dimensions from the first call (:func:`dynamic_shapes`): one graph serves every width and micro-batch, where
    dynamo would otherwise compile a graph for the first shape and then the same graph again with it dynamic.
    Train/eval and grad/no-grad each keep their own graph.

    ``cuda_graphs``: torch.compile's ``mode="reduce-overhead"``: each pass is recorded once per shape as a
    CUDA graph (CUDA Graph Trees) and replayed, one launch instead of a host-side launch per kernel. Every call
    starts a new step of the graphs (``torch.compiler.cudagraph_mark_step_begin``): the outputs of a call live in
    the graphs' memory pool until the next call, so a caller consumes them (and, in training, the gradients of a
    micro-batch) before it calls again."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    if cuda_graphs:
        model.forward = _stepped(sizes_apart(torch.compile(model.forward, mode="reduce-overhead")))
    else:
        model.forward = sizes_apart(torch.compile(model.forward))
    model.register_forward_pre_hook(dynamic_shapes, with_kwargs=True)


def _stepped(compiled):
    """``compiled`` that marks a new step of its CUDA graphs before every call (``replays_cuda_graphs`` says so);
    it keeps the eager callable where :func:`eager_forward` looks for it."""

    @functools.wraps(compiled)
    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)

    forward._torchdynamo_orig_callable = compiled._torchdynamo_orig_callable
    forward.replays_cuda_graphs = True
    return forward


def sizes_apart(compiled: Callable) -> Callable:
    """``compiled`` (a torch.compile'd callable) traced without Dynamo's duck sizing, which gives dynamic dimensions
    of equal size at the first call one symbol: micro-batches of 64 rows padded to 64 columns would tie the batch
    to the sequence, and the first batch where they differ would trace the graphs again. Widths are rounded to a
    multiple of 32 and micro-batches are mostly powers of two, so such a tie is common."""
    return fx_config.patch(use_duck_shape=False)(compiled)


def dynamic_shapes(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """A forward pre-hook that marks the batch and sequence dimensions of a call's tensors dynamic for torch.compile
    (``torch._dynamo.maybe_mark_dynamic``), as a trainer does whose batches vary in size and length. The first
    tensor argument of two or more dimensions (``input_ids`` of a model, the hidden states of a decoder block) gives
    both: its first dimension is the batch, its second the sequence. A tensor's first dimension of the batch's size
    is marked, and every later dimension of the sequence's length (a 4-D mask's last two; a 1-D tensor's only one).
    A dynamic batch lets one graph serve every micro-batch size: a step's last, shorter micro-batch, and the probes
    of a search that differ in ``micro_batch_size``, which then load the graphs an earlier probe compiled from the
    shared cache instead of compiling their own. Marking changes nothing eagerly; under dynamo a marked dimension
    that the code pins to one value stays static, it is never an error."""
    tensors = [t for v in (*args, *kwargs.values()) for t in (v if isinstance(v, (tuple, list)) else (v,))
               if isinstance(t, torch.Tensor)]
    first = next((t for t in tensors if t.dim() >= 2), None)
    if first is None:
        return
    batch, seq = first.shape[:2]
    for t in tensors:
        if t.dim() >= 2 and t.shape[0] == batch and batch >= 2:  # dynamo specializes sizes 0 and 1 anyway
            torch._dynamo.maybe_mark_dynamic(t, 0)
        for d in range(1 if t.dim() >= 2 else 0, t.dim()):
            if t.shape[d] == seq and seq >= 2:
                torch._dynamo.maybe_mark_dynamic(t, d)


@contextlib.contextmanager
def eager_forward(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with the eager forwards that :func:`compile_model` (the whole model) or :func:`compile_blocks`
    (each decoder block) replaced, for the duration (then compiled again). For HF ``generate`` on the actor: the
    prefill, each decode step a token with a growing cache, and each block's own cache layer would make dynamo
    trace graphs that no training pass uses; the compiled graphs serve the training passes."""
    swapped = [(m, m.__dict__["forward"]) for m in (model, *decoder_layers(model))
               if hasattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable")]
    for m, compiled in swapped:
        m.forward = compiled._torchdynamo_orig_callable
    try:
        yield model
    finally:
        for m, compiled in swapped:
            m.forward = compiled


def compile_blocks(model: nn.Module) -> None:
    """torch.compile the forward of each decoder block in place, as torchtitan compiles per block before it
    shards: a block's norms, rotary embedding, activation and residual adds fuse into a few kernels, FSDP's
    hooks stay outside the compiled code and parameter names do not change (weight sync relies on them).
    The batch and sequence dimensions of a block's inputs are dynamic from the first call (:func:`dynamic_shapes`), as
    for a whole model. The blocks share one code object, so dynamo may keep a graph per block: its cache limit
    is raised to fit."""
    blocks = decoder_layers(model)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 8 * len(blocks))
    for block in blocks:
        block.forward = sizes_apart(torch.compile(block.forward))
        block.register_forward_pre_hook(dynamic_shapes, with_kwargs=True)


def full_params(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) one parameter at a time, gathering FSDP shards as it goes.

    Every rank must iterate (the gather is a collective); only the consumer on rank 0
    needs the values. Gathering per parameter keeps peak memory at one full tensor.
    """
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield _clean_name(name), full


def _clean_name(name: str) -> str:
    # activation checkpoint wrappers insert this prefix; the rollout engine's names don't have it
    return name.replace("_checkpoint_wrapped_module.", "")
