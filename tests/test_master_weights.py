"""bf16 weights for compute, fp32 masters for the update (``system.memory.master_weights``), on CPU."""

from __future__ import annotations

import torch
from torch import nn

from tunekit.placement.dist import Dist
from tunekit.trainer import algos
from tunekit.trainer.optim import MasterWeights, Optimizer, adamw
from tunekit.trainer.update import ppo_update


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


def _micro_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int) -> list[list[torch.Tensor]]:
    """Each micro-batch's gradient alone, from a fresh backward."""
    out = []
    for i in range(0, len(x), micro):
        model.zero_grad(set_to_none=True)
        ((model(x[i : i + micro].to(torch.bfloat16)).float() - y[i : i + micro]) ** 2).sum().backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def test_masters_stay_fp32_and_the_model_computes_in_bf16_under_the_same_names():
    model = _mlp()
    names, fp32 = list(model.state_dict()), [p.detach().clone() for p in model.parameters()]
    opt = adamw(model, 1e-3, master_weights=True)
    assert isinstance(opt, MasterWeights) and list(model.state_dict()) == names  # weight sync sees the same names
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 and torch.equal(m, w) for m, w in zip(opt.params, fp32))  # exact masters
    assert not isinstance(adamw(_mlp().to(torch.bfloat16), 1e-3, master_weights=True), MasterWeights)  # no fp32 to keep
    assert not isinstance(adamw(_mlp(), 1e-3), MasterWeights)


def test_only_parameters_become_bf16_and_buffers_keep_their_precision():
    from tunekit.workload.models import build_causal_lm

    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    adamw(lm, 1e-3, master_weights=True)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    buffers = dict(lm.named_buffers())
    assert buffers and all(b.dtype == torch.float32 for b in buffers.values())  # the rotary frequencies, unrounded
    ids = torch.randint(0, lm.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    assert lm(input_ids=ids).logits.dtype == torch.bfloat16  # the model runs in bf16 with no autocast around it


def test_each_micro_batch_is_added_once_in_fp32_and_the_bf16_gradients_are_dropped():
    x, y = _data()
    reference = _mlp().to(torch.bfloat16)
    per_micro = _micro_grads(reference, x, y, micro=2)
    model = _mlp()
    opt = MasterWeights(model, lambda ps: torch.optim.SGD(ps, lr=0.0))
    opt.zero_grad()
    for i in range(0, len(x), 2):
        ((model(x[i : i + 2].to(torch.bfloat16)).float() - y[i : i + 2]) ** 2).sum().backward()
        opt.accumulate()
        assert all(p.grad is None for p in model.parameters())  # nothing accumulates in bf16
    for k, m in enumerate(opt.masters):
        want = sum(g[k].float() for g in per_micro)  # four micro-batches, each counted once
        assert m.grad.dtype == torch.float32
        torch.testing.assert_close(m.grad, want, rtol=0, atol=1e-6)


def test_a_step_moves_the_masters_below_bf16_resolution_and_the_weights_follow_them():
    model = _mlp()
    opt = MasterWeights(model, lambda ps: torch.optim.SGD(ps, lr=1.0))
    w0 = model[0].weight.detach().clone()
    master = opt.masters[0]
    start = master.detach().clone()
    # a step of 1e-5 on weights over 0.05: under bf16's half-ulp (at least 1.2e-4 there), so bf16 weights
    # stepped alone would never move; the fp32 master keeps every step
    for _ in range(200):
        opt.zero_grad()
        for m in opt.masters:
            m.grad = torch.full_like(m, -1e-5)
        opt.step()
    torch.testing.assert_close(master, start + 200 * 1e-5, rtol=0, atol=1e-5)  # 2e-3 moved, fp32's rounding apart
    big = w0.abs() > 0.05
    assert torch.equal((w0 + 1e-5)[big], w0[big])  # the same step on bf16 weights: lost
    assert torch.equal(model[0].weight, master.to(torch.bfloat16))  # the compute weights are the rounded masters
    assert not torch.equal(model[0].weight, w0)


def test_the_update_loop_clips_and_steps_the_masters_and_its_gradient_is_the_micro_batch_invariant_one():
    x, y = _data()
    mask = torch.ones(len(x), 1, dtype=torch.long)
    batch = {"input_ids": torch.zeros(len(x), 1, dtype=torch.long), "x": x, "y": y, "response_mask": mask}

    def loss_fn(m, mb):
        return algos.masked_mean((m(mb["x"].to(torch.bfloat16)).float() - mb["y"]) ** 2, mb["response_mask"]), {}

    grads, norms = {}, {}
    for micro in (8, 2):
        model = _mlp()
        opt = MasterWeights(model, lambda ps: torch.optim.SGD(ps, lr=0.0))
        stats = ppo_update(model, opt, batch, loss_fn=loss_fn, mini_batch=8, micro_batch=micro, epochs=1, seed=0,
                           max_grad_norm=1e-3, dist=Dist(), prefix="critic", loss_name="vf_loss")
        grads[micro] = torch.cat([m.grad.flatten() for m in opt.masters])
        norms[micro] = stats["critic/grad_norm"]
    # clipped to 1e-3 in total, from a norm far above it: the masters' gradients are what was clipped
    assert norms[8] > 1e-2 and torch.linalg.vector_norm(grads[8]).item() <= 1e-3 * 1.001
    torch.testing.assert_close(grads[2], grads[8], rtol=2e-2, atol=1e-6)  # bf16 rounding apart, the same gradient
    plain = _mlp()
    ppo_update(plain, Optimizer(torch.optim.SGD(plain.parameters(), lr=0.0)), batch,
               loss_fn=lambda m, mb: (algos.masked_mean((m(mb["x"]) - mb["y"]) ** 2, mb["response_mask"]), {}),
               mini_batch=8, micro_batch=2, epochs=1, seed=0, max_grad_norm=1e-3, dist=Dist(), prefix="critic",
               loss_name="vf_loss")
    torch.testing.assert_close(grads[2], torch.cat([p.grad.flatten() for p in plain.parameters()]), rtol=5e-2,
                               atol=2e-5)  # and the fp32 module's, to bf16's precision
