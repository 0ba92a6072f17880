"""Parameter offload is a memory knob: an actor whose parameters live in host memory learns what a resident one does.

The GPU half is the evidence (FSDP2's CPU offload needs an accelerator); on CPU the same harness checks that its
updates move the weights at all, so a GPU failure points at offload and not at the harness.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tunekit.config import AlgorithmConfig, MemoryConfig
from tunekit.workload.models import build_causal_lm
from tunekit.trainer.roles.actor import Actor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from update_bench import synthetic_batch  # noqa: E402  (the update benchmark's batch: random ids, all-ones masks)

UPDATES = 3


def _trained(device: str, offload: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """(weights before, weights after ``UPDATES`` updates, logits after) of the embedded model's actor."""
    from tunekit.placement.dist import init_from_env

    dist = init_from_env(device)  # one rank: RANK and WORLD_SIZE default to 0 and 1
    torch.manual_seed(0)
    model = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    before = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    actor = Actor(model, algo=AlgorithmConfig(actor_lr=1e-3), dist=dist, micro_batch=8, temperature=1.0,
                  mem=MemoryConfig(fsdp_single_gpu=True, param_offload=offload))
    batch = synthetic_batch(16, 8, 8, model.config.vocab_size)
    for i in range(UPDATES):
        actor.update(batch, mini_batch=16, seed=i)
    after = {n: t.detach().float().cpu().clone() for n, t in actor.named_full_params()}
    actor.model.eval()
    with torch.no_grad():
        logits = actor.model(input_ids=batch["input_ids"][:2].to(dist.device)).logits.float().cpu()
    return before, after, logits


def _moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    assert set(before) <= set(after), sorted(set(before) - set(after))[:4]  # tied weights appear under both names
    return sum(float((after[n] - before[n]).norm() ** 2) for n in before) ** 0.5


def test_the_harness_updates_move_the_weights_on_cpu():
    before, after, _ = _trained("cpu", offload=False)
    assert _moved(before, after) > 1e-3


@pytest.mark.gpu
def test_an_offloaded_actor_learns_what_a_resident_one_learns(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("FSDP2's CPU offload needs an NVIDIA GPU")
    from tunekit.placement.ports import free_port

    # the one-rank process group FSDP2 needs, its rendezvous scoped to this test
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        before, resident, logits = _trained("cuda", offload=False)
        _, offloaded, logits_off = _trained("cuda", offload=True)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    moved, moved_off = _moved(before, resident), _moved(before, offloaded)
    assert moved_off > 0.5 * moved, f"offloaded weights moved {moved_off:.3g}, resident ones {moved:.3g}"
    # Adam moves every weight by about its learning rate a step, whatever the gradient's size, so a weight whose
    # gradient is within bf16 noise of zero may step either way in two runs: the updates are compared as vectors,
    # not weight by weight (on an H200 the largest one-weight gap was as large as a whole update, 0.0031 vs 0.0030)
    gap = sum(float((resident[n] - offloaded[n]).norm() ** 2) for n in before) ** 0.5
    assert gap < 0.25 * moved, f"the updates differ by {gap:.3g}, {gap / moved:.0%} of the resident update's norm"
    torch.testing.assert_close(logits_off, logits, atol=5e-2, rtol=5e-2)


_PROBE_SETS = ["system.device=cuda", "system.rollout.gpu_memory_utilization=0.1", "system.compile=false",
               "system.memory.param_offload=true", "profiler.comm_steps=0", "probe.steps=60"]


def _offloaded_probe(out, backend: str) -> float:
    """A probe of the embedded task on the GPU with parameter offload; returns its reward gain (last ten steps over
    the first ten) after checking it ran and its rollout stayed on-policy."""
    from tunekit.config import load_recipe
    from tunekit.launch.probe import run_probe
    from tunekit.rundir import read_steps

    result = run_probe(load_recipe(None, [*_PROBE_SETS, f"system.rollout.backend={backend}"]), out=out)
    s = result.summary
    assert result.status == "ok", s["reason"]
    steps = read_steps(result.run_dir)
    assert steps["rollout/logprob_abs_diff_mean"].max() < 0.05, "the rollout sampled from weights the actor left"
    if backend == "vllm":  # the default engine sleeps at level 2: it holds only the weights synced after a wake
        assert (steps["rollout/weight_sync_bytes"] > 0).all() and (steps["timing_s/update_weights"] > 0).all()
    return s["reward_last10"] - s["reward_first10"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_an_offloaded_probe_learns_the_embedded_task(tmp_path, backend):
    """Two trials of a GPU search with parameter offload (HF generate, and a vLLM engine) ended with bit-identical
    rewards, as if their updates never reached the policy they sampled from. An offloaded probe of the embedded task
    must learn as a resident one does (a resident probe on CPU: reward 0.35 over the first ten steps, 0.59 over
    steps 50-59), and its rollout must stay on-policy."""
    from conftest import vllm_gpu_skip

    if backend == "vllm":
        reason = vllm_gpu_skip()
    else:
        reason = None if torch.cuda.is_available() else "needs an NVIDIA GPU"
    if reason:
        pytest.skip(reason)
    gain = _offloaded_probe(tmp_path, backend)
    assert gain >= 0.1, gain
