"""``probe.save_policy``: the trained policy written as a Hugging Face checkpoint that transformers loads, from one
rank, from FSDP's shards on two, and from the single controller's actor group; refused by the framework runners."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tunekit import rundir
from tunekit.config import load_recipe
from tunekit.config.errors import TunekitError
from tunekit.launch.probe import check_probe, run_probe
from tunekit.placement.dist import Dist
from tunekit.trainer.build import build_policy, load_tokenizer
from tunekit.trainer.parallel import full_params
from tunekit.trainer.save_policy import gathered, write_policy
from tunekit.workload.models import EMBEDDED_MODEL_DIR

SMALL = ["system.batch.prompts_per_step=8", "system.batch.micro_batch_size=8", "probe.warmup_steps=1",
         "probe.save_policy=true", "system.device=cpu"]


def _initial() -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR).state_dict()


def test_written_weights_are_the_trained_ones_exactly_with_the_tied_head_tied(tmp_path):
    recipe = load_recipe(None, ["system.device=cpu"])
    tokenizer = load_tokenizer(recipe)
    policy = build_policy(recipe, tokenizer)
    with torch.no_grad():  # weights no checkpoint holds, as after training
        for p in policy.parameters():
            p.add_(torch.randn_like(p))
    out = write_policy(recipe, gathered(recipe, full_params(policy), Dist()), tokenizer, tmp_path)
    assert out == tmp_path / rundir.POLICY and not (tmp_path / "policy.partial").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    want = policy.state_dict()
    assert set(loaded.state_dict()) == set(want)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    assert loaded.lm_head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    assert AutoTokenizer.from_pretrained(out).encode("12+3=") == tokenizer.encode("12+3=")


@pytest.mark.slow  # two probes of two steps: about 40 s on 2 cores
@pytest.mark.parametrize("sets", [
    ["system.device_map={actor: [0, 1], critic: [0, 1], ref: [0, 1], rollout: [0, 1], reward: [0, 1]}"],  # FSDP shards
    ["system.controller=single"],  # the actor group's weights, written by the driver
], ids=["spmd-2-ranks", "single-controller"])
def test_a_probe_leaves_its_trained_policy_loadable(tmp_path, monkeypatch, sets):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = run_probe(load_recipe(None, SMALL + sets + ["probe.steps=2"]), out=tmp_path, run_id="P")
    assert result.status == "ok", result.summary["reason"]
    assert result.summary[rundir.POLICY] == str(result.run_dir / rundir.POLICY)
    trained = AutoModelForCausalLM.from_pretrained(result.run_dir / rundir.POLICY).state_dict()
    initial = _initial()
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in initial.items()}
    assert all(torch.isfinite(v).all() for v in trained.values())
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # two steps of training moved it


def test_the_framework_runners_refuse_it_and_name_their_own_saving():
    from tunekit.runners import trl, verl_refusals

    sets = ["algorithm.name=grpo", "system.batch.samples_per_prompt=2", "probe.save_policy=true"]
    with pytest.raises(TunekitError, match="probe.save_policy: runner trl saves through TRL's own save_strategy"):
        check_probe(load_recipe("tiny-grpo", sets + ["runner=trl"]))
    said = verl_refusals.refusals(load_recipe("tiny-grpo", sets + ["runner=verl"]), gpu=True)
    assert any(line.startswith("probe.save_policy: runner verl saves through its own trainer.save_freq") for line in said)
    assert not any("save_policy" in line for line in trl.refusals(load_recipe("tiny-grpo", sets[:-1] + ["runner=trl"]), gpu=True))


@pytest.mark.gpu
def test_a_gpu_probe_leaves_its_policy_in_bf16_loadable(tmp_path):
    """On a GPU the policy is gathered from FSDP2's shards (one GPU: the plain module or fully_shard as the recipe
    resolves) and written in the rollout's bf16; transformers loads it back with the trained weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    sets = ["system.batch.prompts_per_step=8", "system.batch.micro_batch_size=8", "probe.warmup_steps=1",
            "probe.save_policy=true", "system.device=cuda", "system.rollout.backend=hf", "system.compile=false",
            "system.memory.fsdp_single_gpu=true", "probe.steps=2"]
    result = run_probe(load_recipe(None, sets), out=tmp_path, run_id="P")
    assert result.status == "ok", result.summary["reason"]
    loaded = AutoModelForCausalLM.from_pretrained(result.run_dir / rundir.POLICY)
    assert loaded.dtype == torch.bfloat16
    initial = _initial()
    trained = loaded.state_dict()
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in initial.items()}
    assert any(not torch.equal(trained[k].float(), initial[k].to(torch.bfloat16).float()) for k in initial)
