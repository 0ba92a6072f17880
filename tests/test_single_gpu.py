"""``system.memory.fsdp_single_gpu: false``: one rank runs the plain module, not FSDP2: bf16 weights over fp32 masters,
or fp32 weights under bf16 autocast (``system.memory.master_weights: false``)."""

from __future__ import annotations

import pytest
import torch

from tunekit.config import MemoryConfig
from tunekit.workload.models import build_causal_lm
from tunekit.trainer.optim import MasterWeights, adamw
from tunekit.trainer.parallel import autocast_bf16, shard


def _lm():
    torch.manual_seed(0)
    return build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)


def _ids(lm) -> torch.Tensor:
    return torch.randint(0, lm.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))


def test_autocast_keeps_names_and_fp32_weights_and_computes_in_bf16() -> None:
    lm = _lm()
    names = list(lm.state_dict())
    ids = _ids(lm)
    want = lm(input_ids=ids).logits
    wrapped = autocast_bf16(lm, "cpu")
    assert wrapped is lm and list(lm.state_dict()) == names  # weight sync and checkpoints see the same names
    out = lm(input_ids=ids).logits
    assert out.dtype == torch.bfloat16  # the LM head's matmul ran in bf16
    torch.testing.assert_close(out.float(), want, atol=0.1, rtol=0.05)
    out.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in lm.parameters() if p.requires_grad)


def test_one_cpu_rank_never_shards_whatever_the_knob() -> None:
    for flag in (True, False):
        lm = shard(_lm(), MemoryConfig(fsdp_single_gpu=flag), torch.device("cpu"), 1)
        assert type(lm).__name__ == "Qwen2ForCausalLM"
        assert lm(input_ids=_ids(lm)).logits.dtype == torch.float32


@pytest.mark.gpu
def test_one_gpu_without_fsdp_computes_in_bf16_over_fp32_masters_or_under_autocast() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from torch.distributed.fsdp import FSDPModule

    cuda = torch.device("cuda")
    lm = shard(_lm(), MemoryConfig(fsdp_single_gpu=False), cuda, 1)
    opt = adamw(lm, 1e-3, master_weights=MemoryConfig(fsdp_single_gpu=False).keeps_masters(gpu=True, world=1))
    assert not isinstance(lm, FSDPModule) and isinstance(opt, MasterWeights)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16} and {m.dtype for m in opt.masters} == {torch.float32}
    assert lm(input_ids=_ids(lm).cuda()).logits.dtype == torch.bfloat16
    auto = shard(_lm(), MemoryConfig(fsdp_single_gpu=False, master_weights=False), cuda, 1)
    assert {p.dtype for p in auto.parameters()} == {torch.float32}
    assert auto(input_ids=_ids(auto).cuda()).logits.dtype == torch.bfloat16  # autocast
    frozen = shard(_lm(), MemoryConfig(), cuda, 1, trainable=False)
    assert {p.dtype for p in frozen.parameters()} == {torch.bfloat16}
