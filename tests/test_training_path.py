"""``system.memory.fsdp_single_gpu`` and ``system.compile`` at ``auto``: the plain module compiled on one GPU, FSDP2
where a role spans GPUs or offloads, nothing compiled on CPU; and the probe's summary says which ran."""

from __future__ import annotations

import pytest

from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError
from tunekit.launch.probe import summarize
from tunekit.runners import runner_for

TWO = "system.device_map={actor: [0, 1], critic: [0, 1], ref: [0, 1], rollout: [0, 1], reward: [0, 1]}"


def path(sets: list[str], *, gpu: bool) -> tuple[bool, bool]:
    r = load_recipe(None, sets)
    p = runner_for(r).training_path(r, gpu=gpu)
    return p["resolved/fsdp"], p["resolved/compile"]


@pytest.mark.parametrize("sets, gpu, fsdp, compiled", [
    ([], True, False, True),                                   # one GPU: the plain module, compiled
    ([], False, False, False),                                 # CPU: as before, plain and eager
    ([TWO], True, True, False),                                # two GPUs: FSDP2, eager
    ([TWO], False, True, False),                               # two CPU ranks over gloo: FSDP2, eager
    (["system.memory.param_offload=true"], True, True, False),  # offload needs FSDP2
    (["system.memory.fsdp_single_gpu=true"], True, True, False),
    (["system.compile=false"], True, False, False),
    (["system.compile=true"], False, False, True),             # an explicit value wins on CPU too
    (["system.memory.fsdp_single_gpu=true", "system.compile=true"], True, True, True),
    (["system.controller=single", "system.device_map.actor=[0, 1]"], True, True, False),  # the actor's own group
    (["system.controller=single", "system.device_map.ref=[0, 1]"], True, False, True),
])
def test_auto_resolves_to_the_fast_path_only_where_it_applies(sets, gpu, fsdp, compiled) -> None:
    assert path(sets, gpu=gpu) == (fsdp, compiled)


@pytest.mark.parametrize("sets, gpu, masters", [
    ([], True, True),                                           # one GPU, the plain module: bf16 over fp32 masters
    (["system.memory.master_weights=false"], True, False),      # fp32 under autocast
    ([], False, False),                                         # CPU: fp32 throughout
    ([TWO], True, False),                                       # FSDP2: its mixed-precision policy instead
    (["system.memory.fsdp_single_gpu=true"], True, False),
])
def test_master_weights_resolve_where_the_plain_module_runs_on_a_gpu(sets, gpu, masters) -> None:
    r = load_recipe(None, sets)
    assert runner_for(r).training_path(r, gpu=gpu)["resolved/master_weights"] is masters


@pytest.mark.parametrize("sets, gpu, graphs", [
    ([], True, True),                                           # compiled plain module over fp32 masters
    (["system.cuda_graphs=false"], True, False),
    (["system.cuda_graphs=true"], True, True),
    (["system.cuda_graphs=true"], False, False),               # CPU: nothing to capture
    (["system.cuda_graphs=true", "system.compile=false"], True, False),  # only compiled passes are captured
    (["system.cuda_graphs=true", "system.memory.master_weights=false"], True, False),  # grads kept across micro-batches
    (["system.cuda_graphs=true", TWO], True, False),           # FSDP2's hooks stay outside the compiled blocks
])
def test_cuda_graphs_apply_only_to_a_compiled_plain_module_with_master_weights(sets, gpu, graphs) -> None:
    r = load_recipe(None, sets)
    assert runner_for(r).training_path(r, gpu=gpu)["resolved/cuda_graphs"] is graphs


def test_auto_is_the_default_and_yaml_spells_the_three_values() -> None:
    r = load_recipe(None)
    assert r.system.compile == "auto" and r.system.memory.fsdp_single_gpu == "auto"
    r = load_recipe(None, ["system.compile=true", "system.memory.fsdp_single_gpu=false"])
    assert r.system.compile is True and r.system.memory.fsdp_single_gpu is False
    with pytest.raises(ConfigError) as e:
        load_recipe(None, ["system.compile=sometimes"])
    assert "system.compile" in e.value.message and "'sometimes'" in e.value.message


def test_a_gpu_default_probe_shares_the_compile_cache_and_a_cpu_one_does_not(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "default"))
    r = load_recipe(None)
    runner = runner_for(r)
    assert runner.env(r, tmp_path / "runs" / "a", on_gpu=True)["TORCHINDUCTOR_CACHE_DIR"] != str(tmp_path / "default")
    assert runner.env(r, tmp_path / "runs" / "b", on_gpu=False)["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "default")


def test_the_summary_records_the_resolved_path(tmp_path) -> None:
    r = load_recipe(None, ["system.device=cpu"])
    summary = summarize(r, tmp_path, "failed", "no steps", 1.0, None)
    assert summary["resolved/fsdp"] is False and summary["resolved/compile"] is False
    r = load_recipe(None, ["system.device=cpu", "system.compile=true"])
    assert summarize(r, tmp_path, "failed", "no steps", 1.0, None)["resolved/compile"] is True


def test_the_trl_runner_keeps_trls_own_compile_default() -> None:
    pytest.importorskip("trl")
    r = load_recipe(None, ["runner=trl", "algorithm.name=grpo", "system.batch.samples_per_prompt=4"])
    assert runner_for(r).training_path(r, gpu=True) == {"resolved/fsdp": False, "resolved/compile": False,
                                                        "resolved/master_weights": False, "resolved/cuda_graphs": False,
                                                        "resolved/old_logprob": False}  # HF generate, one mini-batch
    r = load_recipe(None, ["runner=trl", "algorithm.name=grpo", "system.batch.samples_per_prompt=4", "system.compile=true"])
    assert runner_for(r).training_path(r, gpu=True)["resolved/compile"] is True


@pytest.mark.gpu
def test_one_gpu_default_builds_the_plain_module_compiled_whole() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from torch.distributed.fsdp import FSDPModule

    from tunekit.placement.dist import Dist
    from tunekit.workload.models import build_causal_lm
    from tunekit.trainer.build import build_actor

    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    actor = build_actor(load_recipe(None, ["system.device=cuda"]), Dist(device=torch.device("cuda", 0)), lm)
    assert not isinstance(actor.model, FSDPModule) and actor.compiled
    assert hasattr(actor.model.forward, "_torchdynamo_orig_callable")
