"""A role's optimizer as the update loop drives it: zero the gradients, accumulate each micro-batch's, clip, step.

Two kinds. :class:`Optimizer` steps a torch optimizer over the model's own parameters: FSDP2's sharded fp32
masters, or the plain module on CPU. :class:`MasterWeights` is the mixed precision Megatron-LM keeps on a GPU for
a plain module: the model holds bf16 weights and computes in bf16 without autocast, while fp32 master weights,
their fp32 gradients and AdamW's state live beside it. Per micro-batch the bf16 gradients are added into the fp32
ones in one call and dropped; per optimizer step the masters step and are copied back into the bf16 weights. Under
autocast every fp32 weight was cast to bf16 in every micro-batch's forward, and every gradient cast back and added
to ``.grad`` one kernel at a time.
"""

from __future__ import annotations

import torch
from torch import nn


class Optimizer:
    """A torch optimizer over the parameters it was built on; gradients accumulate in ``.grad`` as autograd puts
    them there."""

    def __init__(self, optim: torch.optim.Optimizer) -> None:
        self.optim = optim

    @property
    def params(self) -> list[torch.Tensor]:
        """The tensors the optimizer steps (whose ``.grad`` is the accumulated gradient)."""
        return [p for g in self.optim.param_groups for p in g["params"]]

    def zero_grad(self) -> None:
        self.optim.zero_grad(set_to_none=True)

    def accumulate(self) -> None:
        """After each micro-batch's backward: nothing to do, autograd accumulated into ``.grad``."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the accumulated gradients to ``max_norm`` in total; returns their norm before clipping. Works for
        DTensor (FSDP2) and plain parameters alike."""
        norm = nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def step(self) -> None:
        self.optim.step()


class MasterWeights(Optimizer):
    """bf16 weights in ``model`` for compute; fp32 masters, gradients and optimizer state for the update.

    Built on a model whose parameters are fp32 (the trainable ones become the masters, exactly); the model's
    parameters are cast to bf16 in place (:func:`bf16_parameters`), so their names and the module stay the same
    (weight sync reads them as they are).
    ``make_optim(masters)`` builds the torch optimizer over the masters.
    """

    def __init__(self, model: nn.Module, make_optim) -> None:
        self.compute = [p for p in model.parameters() if p.requires_grad]
        masters = [p.detach().clone() for p in self.compute]
        bf16_parameters(model)
        super().__init__(make_optim(masters))
        self.masters = masters

    def accumulate(self) -> None:
        """Add this micro-batch's bf16 gradients into the masters' fp32 ones (the first becomes them) and drop
        them, so the next backward writes fresh ones without an addition of its own."""
        sums, grads = [], []
        for m, p in zip(self.masters, self.compute):
            if p.grad is not None and m.grad is None:
                m.grad = p.grad.float()
            elif p.grad is not None:
                sums.append(m.grad)
                grads.append(p.grad)
            p.grad = None
        if sums:
            torch._foreach_add_(sums, grads)

    def step(self) -> None:
        """Step the fp32 masters, then copy them into the bf16 weights the model computes with."""
        super().step()
        with torch.no_grad():
            torch._foreach_copy_(self.compute, self.masters)


def bf16_parameters(model: nn.Module) -> nn.Module:
    """Cast ``model``'s parameters to bf16 in place, and nothing else: buffers keep their dtype (a rotary
    embedding's fp32 frequencies, as an inference engine keeps them), where ``model.to(torch.bfloat16)`` would
    round them too."""
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model


def adamw(model: nn.Module, lr: float, *, master_weights: bool = False) -> Optimizer:
    """AdamW over ``model``: the fused kernel where the parameters live on a GPU, as torchtitan runs FSDP2 by
    default; the foreach loop elsewhere (CPU, and parameters offloaded to the host). ``master_weights``: over fp32
    masters of a plain module's fp32 parameters, which become bf16 (:class:`MasterWeights`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    on_gpu = bool(params) and all(p.device.type == "cuda" for p in params)

    def make(ps):
        return torch.optim.AdamW(ps, lr=lr, weight_decay=0.0, fused=on_gpu or None)

    if master_weights and params and all(p.dtype == torch.float32 for p in params):
        return MasterWeights(model, make)
    return Optimizer(make(params))
