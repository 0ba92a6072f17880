"""The memory verdict: per-role bytes from shapes, batch and memory knobs, each case worked out by hand."""

from __future__ import annotations

import pytest

from tunekit.config import load_recipe
from tunekit.estimate.memory import ModelShape, estimate_memory, headroom, verdict
from tunekit.runners import runner_for

# 1e9 parameters in 10 layers, hidden 1000, MLP 4000, vocabulary 1000: a block keeps 8 x 1000 + 4 x 4000 bf16
# values a token, 48 000 bytes
SHAPE = ModelShape(n_params=10**9, n_layers=10, hidden=1000, vocab=1000, kv_dim=100, intermediate=4000)
# GRPO without a KL: actor + rollout only; prompts "20+20=" are 6 tokens, responses 96: 102 tokens a sample
# FSDP2 on one GPU too (the plain module's own case is its test's)
BASE = ["algorithm.name=grpo", "system.batch.samples_per_prompt=4", "system.batch.micro_batch_size=4",
        "task.max_new_tokens=96", "system.rollout.backend=vllm", "system.memory.fsdp_single_gpu=true"]
CARD = 80  # GiB
CONTEXT = 1.9 * 2**30  # one process's memory outside the allocator: 2 040 109 465.6 B


def _est(*sets: str, shape: ModelShape = SHAPE, card=CARD):
    r = load_recipe(None, BASE + list(sets))
    return estimate_memory(r, shape, card, traits=runner_for(r).traits)


def test_actor_states_activations_and_a_sleeping_engine():
    est = _est("system.rollout.gpu_memory_utilization=0.5")
    actor, rollout = est.roles
    # fp32 masters 4 GB, fp32 gradients 4 GB, AdamW's two fp32 moments 8 GB
    assert (actor.weights, actor.grads, actor.optimizer) == (4e9, 4e9, 8e9)
    # 408 tokens x 48 000 B x 10 layers + logits 4 x 96 x 1000 x 16 B + two gathered bf16 blocks (2 x 0.2 GB)
    assert actor.activations == pytest.approx(195_840_000 + 6_144_000 + 400_000_000)
    assert actor.slack == pytest.approx(150_496_000)  # a quarter of the 601 984 000 B the allocator churns through
    assert rollout.engine == 0.5 * 80 * 2**30 and rollout.engine_sleeps
    # the engine sleeps through training, but wakes beside the actor's cached blocks (0.75 GB activations and
    # slack), which the card holds with room: 16 GB states + 42.95 GB pool + 0.75 GB + 2.04 GB context
    assert est.gpus[0].outside == pytest.approx(CONTEXT)
    assert est.gpus[0].peak == pytest.approx(16e9 + 42_949_672_960 + 752_480_000 + CONTEXT)
    assert est.verdict == "fits"


def test_the_trainer_hands_its_cached_blocks_back_where_the_waking_engine_would_not_fit_beside_them():
    """At 0.78 the pool (67.0 GB) fits beside the states and the context (85.0 of 85.9 GB) but not with the actor's
    0.75 GB of cached blocks and the 1 GiB a waking engine is left: the trainer empties its cache first, so the
    pool and the activations never coexist."""
    room, tight = (_est(f"system.rollout.gpu_memory_utilization={u}") for u in (0.5, 0.78))
    pool = 0.78 * 80 * 2**30
    assert tight.gpus[0].peak == pytest.approx(16e9 + pool + CONTEXT)
    assert room.gpus[0].peak - (16e9 + 0.5 * 80 * 2**30 + CONTEXT) == pytest.approx(752_480_000)


def test_an_engine_that_stays_awake_adds_to_the_resident_states():
    est = _est("system.rollout.gpu_memory_utilization=0.78", "system.rollout.enable_sleep=false")
    # 16 GB states + 67.00 GB pool + 0.75 GB activations and slack + 2.04 GB context = 85.79 GB of a 85.90 GB card
    assert est.gpus[0].peak == pytest.approx(16e9 + 67_001_489_817.6 + 752_480_000 + CONTEXT)
    assert est.verdict == "tight"


def test_twice_the_parameters_would_not_fit_and_two_gpus_shard_them_back():
    big = ModelShape(n_params=2 * 10**9, n_layers=10, hidden=1000, vocab=1000, kv_dim=100, intermediate=4000)
    one = _est("system.rollout.gpu_memory_utilization=0.75", shape=big)
    assert one.gpus[0].peak == pytest.approx(32e9 + 64_424_509_440 + CONTEXT)  # 98.5 GB on an 85.9 GB card
    assert one.verdict == "would not fit"
    two = _est("system.rollout.gpu_memory_utilization=0.75",
               "system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}",
               shape=big)
    assert [g.gpu for g in two.gpus] == [0, 1]
    assert two.roles[0].weights == 4e9  # 2e9 fp32 parameters over two GPUs
    # each GPU: 16 GB states + 64.42 GB pool + the actor's 1.25 GB of cached blocks (activations with two gathered
    # 0.4 GB blocks, and slack) + a context and NCCL's buffers (1.9 + 0.35 GiB) = 84.09 GB
    assert two.gpus[1].peak == pytest.approx(16e9 + 64_424_509_440 + 1_252_480_000 + 2.25 * 2**30)
    assert two.verdict == "tight"


def test_offload_and_checkpointing_move_what_they_should():
    gone = _est("system.memory.param_offload=true").roles[0]
    assert (gone.weights, gone.grads, gone.optimizer) == (0, 0, 0)
    ckpt = _est("system.memory.gradient_checkpointing=true").roles[0]
    # block inputs 408 x 1000 x 2 B x 10 layers + one block's 408 x 48 000 B, logits and gathered blocks as before
    assert ckpt.activations == pytest.approx(8_160_000 + 19_584_000 + 6_144_000 + 400_000_000)
    whole = _est("system.memory.reshard_after_forward=false").roles[0]
    assert whole.activations == pytest.approx(195_840_000 + 6_144_000 + 2e9)  # every block stays gathered


def test_ppo_adds_a_critic_without_logits_and_a_bf16_master_halves_the_states():
    r = load_recipe(None, ["system.batch.micro_batch_size=4", "task.max_new_tokens=96",
                           "system.memory.fsdp_single_gpu=true"])
    ppo = estimate_memory(r, SHAPE, CARD, traits=runner_for(r).traits)
    assert [r.role for r in ppo.roles] == ["actor", "critic", "rollout"]
    assert ppo.roles[1].activations == pytest.approx(195_840_000 + 400_000_000)
    bf16 = _est("model.dtype=bfloat16").roles[0]
    assert (bf16.weights, bf16.grads, bf16.optimizer) == (2e9, 2e9, 4e9)


def test_the_plain_module_keeps_a_bf16_copy_of_its_fp32_weights_instead_of_gathered_blocks():
    plain = _est("system.memory.fsdp_single_gpu=auto").roles[0]  # auto on one GPU: the plain module
    # activations and logits as with FSDP2, plus autocast's bf16 copy of 1e9 fp32 weights (2 GB) for backward
    assert plain.activations == pytest.approx(195_840_000 + 6_144_000 + 2e9)
    assert _est("system.memory.fsdp_single_gpu=false", "model.dtype=bfloat16").roles[0].activations == pytest.approx(
        195_840_000 + 6_144_000)  # bf16 weights: nothing to cast
    two = _est("system.memory.fsdp_single_gpu=auto",
               "system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}")
    assert two.roles[0].activations == pytest.approx(195_840_000 + 6_144_000 + 400_000_000)  # FSDP2 again


def test_master_weights_hold_bf16_weights_beside_the_fp32_masters_and_the_frozen_reference_is_bf16():
    kl = ["algorithm.kl_coef=0.1"]  # GRPO with a KL: a reference model
    masters = {r.role: r for r in _est("system.memory.fsdp_single_gpu=auto", *kl).roles}
    autocast = {r.role: r for r in _est("system.memory.fsdp_single_gpu=auto", "system.memory.master_weights=false",
                                         *kl).roles}
    # 1e9 parameters: 4 GB fp32 masters + 2 GB bf16 weights, against 4 GB of fp32 weights under autocast
    assert (masters["actor"].weights, autocast["actor"].weights) == (6e9, 4e9)
    assert masters["actor"].grads == autocast["actor"].grads == 4e9  # the gradients stay fp32
    assert masters["actor"].activations == autocast["actor"].activations  # bf16 gradients vs bf16 weight copies
    assert masters["ref"].weights == autocast["ref"].weights == 2e9  # a frozen plain module computes in bf16
    fsdp = {r.role: r for r in _est(*kl).roles}  # FSDP2 on one GPU: fp32 shards, no effect of the knob
    assert (fsdp["actor"].weights, fsdp["ref"].weights) == (4e9, 4e9)


def test_hf_generation_holds_its_kv_cache_and_no_pool():
    est = _est("system.rollout.backend=hf")
    rollout = est.roles[1]
    # KV: 32 x 4 = 128 rows x 102 tokens x 10 layers x K and V x 100 x 2 B = 52 224 000 B; scores: 128 rows x 96
    # steps x 1000 x 12 B = 147 456 000 B; it generates with the actor's weights
    assert rollout.activations == pytest.approx(52_224_000 + 147_456_000) and rollout.weights == 0
    assert rollout.slack == pytest.approx(0.45 * 199_680_000)  # a cache grown a token at a time fragments more
    assert rollout.engine == 0


def test_each_process_on_a_gpu_brings_its_context():
    # a vLLM server tunekit starts on the trainer's GPU is a second process there
    server = _est("system.rollout.backend=vllm_server", "system.rollout.enable_sleep=false")
    assert server.gpus[0].outside == pytest.approx(2 * CONTEXT)
    # the single controller runs one worker process per role: actor, ref and rollout share GPU 0 here
    single = _est("system.controller=single", "algorithm.kl_coef=0.1")
    assert [r.role for r in single.roles] == ["actor", "ref", "rollout"]
    assert single.gpus[0].outside == pytest.approx(3 * CONTEXT)


def test_the_engine_sleeps_where_any_trainer_role_shares_its_gpu_and_the_trainer_puts_it_to_sleep_there():
    from tunekit.trainer.driver import build_roles

    single = ["system.controller=single", "algorithm.kl_coef=0.1", "system.device_map.actor=[0]"]
    cases = {"system.device_map.ref=[1]": True,   # the reference's forward runs beside the engine: it must sleep
             "system.device_map.ref=[0]": False}  # the engine has GPU 1 to itself
    for ref, sleeps in cases.items():
        recipe = load_recipe(None, BASE + single + [ref, "system.device_map.rollout=[1]"])
        rollout = estimate_memory(recipe, SHAPE, CARD, traits=runner_for(recipe).traits).roles[-1]
        assert rollout.role == "rollout" and rollout.engine_sleeps is sleeps
        groups = {"actor": object(), "ref": object(), "rollout": object(), "reward": object()}
        assert build_roles(recipe, groups, tokenizer=None).colocated_rollout is sleeps


def test_the_error_is_against_the_fullest_gpu_nvml_peak():
    from tunekit.estimate.memory import error_fields

    summary = {"memory/estimate_gb": 45.0, "nvml/mem_used_gb/2": 50.0, "nvml/mem_used_gb/3": 30.0,
               "steady": {"perf/max_memory_reserved_gb": 60.0}}
    # (45 - 50) / 50: the estimate was 10 % low; the allocator's 60 GiB is not what the estimate counts
    assert error_fields(summary) == {"memory/measured_gb": 50.0, "memory/estimate_error": pytest.approx(-0.1)}
    assert error_fields({"memory/estimate_gb": 45.0}) == {"memory/measured_gb": None, "memory/estimate_error": None}


def test_a_probe_without_its_own_peak_takes_the_launchers():
    from tunekit.estimate.memory import error_fields
    from tunekit.profiler.nvml import launcher_peaks

    launcher = {"nvml/available": True, "nvml/mem_used_gb/0": 61.5, "nvml/util_mean/0": 40.0, "nvml/energy_j": 9.0}
    killed = {"status": "timeout", "memory/estimate_gb": 60.5}  # killed at its limit: no result, no peak of its own
    filled = killed | launcher_peaks(killed, launcher)
    assert filled["nvml/mem_used_gb/0"] == 61.5 and filled["nvml/source"] == "launcher" and "nvml/util_mean/0" not in filled
    assert error_fields(filled)["memory/measured_gb"] == 61.5
    own = {"status": "ok", "nvml/mem_used_gb/0": 57.6}  # the probe's own record stays as it is
    assert launcher_peaks(own, launcher) == {}
    assert launcher_peaks(killed, {"nvml/available": False, "nvml/reason": "no NVML"}) == {}


def test_an_unknown_card_gives_no_verdict():
    est = _est(card=None)
    assert est.peak is None and est.verdict == "unknown"
    assert verdict(90.0, 100.0) == "fits" and verdict(90.1, 100.0) == "tight" and verdict(100.1, 100.0) == "would not fit"


def test_headroom_reads_each_gpu_peak_against_the_card():
    summary = {"memory/card_gb": 141.0, "nvml/mem_used_gb/0": 70.5, "nvml/mem_used_gb/1": 12.25,
               "steady": {"perf/max_memory_reserved_gb": 30.0}}
    assert headroom(summary) == [("0", 70.5, 141.0), ("1", 12.25, 141.0)]
    assert headroom({"memory/card_gb": 80.0, "steady": {"perf/max_memory_reserved_gb": 30.0}}) == [("allocator", 30.0, 80.0)]
    assert headroom({"nvml/mem_used_gb/0": 70.5}) == []  # no card: no headroom line


def test_estimate_prints_the_per_role_table_and_the_verdict(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tunekit.cli import app

    monkeypatch.chdir(tmp_path)  # no earlier probes here: the cost model's estimate alone
    res = CliRunner().invoke(app, ["estimate", "--recipe", "qwen2.5-7b", "--gpu-profile", "a100-40g",
                                   "--set", "algorithm.name=ppo"])
    assert res.exit_code == 0, res.output
    assert "actor" in res.output and "critic" in res.output and "rollout" in res.output
    assert "GPU 0 (actor, critic, rollout)" in res.output and "would not fit" in res.output


def test_probe_summary_prints_the_headroom_per_gpu(tmp_path, monkeypatch):
    from tunekit.cli import _print_summary, out

    monkeypatch.setattr(out, "width", 200)
    summary = {"status": "ok", "memory/card_gb": 141.0, "memory/estimate_gb": 64.0, "nvml/mem_used_gb/0": 70.5,
               "steady": {}}
    with out.capture() as cap:
        _print_summary(summary, tmp_path / "run")
    text = " ".join(cap.get().split())
    # 141 - 70.5 = 70.5 GiB free; 70.5 / 141 = 50 %
    assert "memory headroom GPU 0" in text and "70.5 GiB free: peak 70.5 of 141 GiB (50%), estimated 64.0 GiB" in text


def test_each_gpu_line_carries_that_gpus_estimate():
    from tunekit.estimate.memory import headroom_lines

    two = {"memory/card_gb": 80.0, "memory/estimate_gb": 64.0, "memory/estimate_gb/0": 64.0, "memory/estimate_gb/1": 20.0,
           "nvml/mem_used_gb/0": 60.0, "nvml/mem_used_gb/1": 24.0}
    assert headroom_lines(two) == [("0", "20.0 GiB free: peak 60.0 of 80 GiB (75%), estimated 64.0 GiB"),
                                   ("1", "56.0 GiB free: peak 24.0 of 80 GiB (30%), estimated 20.0 GiB")]
    # NVML's indices (CUDA_VISIBLE_DEVICES=2,3) are not the device map's: no estimate is put beside the wrong GPU
    moved = {"memory/card_gb": 80.0, "memory/estimate_gb": 64.0, "nvml/mem_used_gb/2": 60.0, "nvml/mem_used_gb/3": 24.0}
    assert [line for _, line in headroom_lines(moved)] == ["20.0 GiB free: peak 60.0 of 80 GiB (75%)",
                                                           "56.0 GiB free: peak 24.0 of 80 GiB (30%)"]


def test_the_kv_cache_record_over_the_steady_steps_and_its_verdict():
    import pandas as pd

    from tunekit.estimate.memory import kv_cache_fields, kv_verdict

    steps = pd.DataFrame({"step": range(6), "rollout/kv_usage_peak": [0.9, 0.2, 0.3, 0.25, 0.4, 0.1],
                          "rollout/preemptions": [4, 0, 0, 0, 2, 0]})
    fields = kv_cache_fields(steps, warmup=2)  # the first steps (warm-up) are left out: 0.9 and its preemptions
    assert fields == {"rollout/kv_usage_peak": 0.4, "rollout/preemptions": 0.5}
    assert kv_verdict(fields).startswith("memory-starved: 0.5 requests preempted a step, the KV cache 40% full")
    assert kv_verdict({"rollout/kv_usage_peak": 0.4, "rollout/preemptions": 0.0}).startswith("60% of the KV cache idle")
    assert kv_verdict({"rollout/kv_usage_peak": 0.8, "rollout/preemptions": 0.0}) == "the KV cache 80% full at its fullest, no preemptions"
    assert kv_cache_fields(pd.DataFrame({"step": range(4), "timing_s/gen": [1.0] * 4}), warmup=1) == {}  # HF generate
    assert kv_verdict({}) is None


def test_a_probe_that_would_not_fit_its_card_is_warned_before_launch():
    """The 1.5B preset at micro-batch 64 (estimated above 100 GiB with HF generation beside PPO's three models) on an
    80 GiB card: one sentence before launch; on an H200, and on CPU, nothing."""
    from tunekit.launch.probe import Plan, fit_warning
    from tunekit.estimate.profiles import load_profile

    big = load_recipe("qwen2.5-1.5b", ["system.batch.micro_batch_size=64"])
    warning = fit_warning(Plan(big, True, load_profile("h100-80g")))
    assert warning.startswith("qwen2.5-1.5b on h100-80g: would not fit: GPU 0 (actor, critic, rollout)")
    assert warning.endswith("of 80 GiB; the probe runs anyway")
    assert fit_warning(Plan(big, True, load_profile("h200"))) is None
    assert fit_warning(Plan(big, False, None)) is None
    assert fit_warning(Plan(load_recipe("qwen2.5-1.5b"), True, load_profile("h100-80g"))) is None  # micro 16: 68 GiB


def test_cuda_graphs_hold_the_largest_graphed_roles_activations_beside_the_waking_engine():
    """The plain module on one GPU with master weights replays CUDA graphs: its activations live in the graphs'
    pool for the whole step, beside the waking engine, without the allocator's slack; eager activations stay there
    only as cached blocks, which the trainer hands back where the engine would not fit beside them. PPO's actor and
    critic share one pool (the larger of the two, not their sum)."""
    plain = ["system.memory.fsdp_single_gpu=false", "system.rollout.gpu_memory_utilization=0.3"]
    graphs, none = _est(*plain, card=141), _est(*plain, "system.cuda_graphs=false", card=141)
    actor, rollout = graphs.roles
    assert actor.graphed and not none.roles[0].graphed and not rollout.graphed
    # with graphs the activations stay in their pool beside the waking engine; without, the allocator keeps them
    # cached there with their slack (141 GiB holds both), so the graphs save the slack
    assert graphs.gpus[0].peak - none.gpus[0].peak == pytest.approx(-actor.slack)
    small = ["system.memory.fsdp_single_gpu=false", "system.rollout.gpu_memory_utilization=0.9"]
    g80, n80 = _est(*small), _est(*small, "system.cuda_graphs=false")  # 80 GiB: the trainer empties its cache
    assert g80.gpus[0].peak - n80.gpus[0].peak == pytest.approx(g80.roles[0].activations)
    ppo = ["algorithm.name=ppo", *small]
    g2, n2 = _est(*ppo), _est(*ppo, "system.cuda_graphs=false")
    actor, critic = g2.roles[:2]
    assert critic.graphed and 0 < critic.activations < actor.activations
    assert g2.gpus[0].peak - n2.gpus[0].peak == pytest.approx(actor.activations)  # one shared pool


@pytest.mark.parametrize("sets, measured_gib", [
    # the recipe's defaults: compiled, CUDA graphs, micro-batch 64, engine 0.3 (NVML peak of the search's baseline)
    ([], 53.72),
    # eager training at micro-batch 32 beside an engine at 0.2: its cached blocks stay while the engine generates
    (["system.compile=false", "system.batch.micro_batch_size=32", "system.rollout.gpu_memory_utilization=0.2",
      "system.rollout.max_num_seqs=256"], 40.14),
])
def test_smollm2_probes_peak_where_an_h200_measured_them(sets, measured_gib):
    """Two probes of the SmolLM2 search on one H200 (2026-12-03): the estimate within 6% of NVML's peak, no longer
    19% under it for the eager one (its cached blocks beside the waking engine, the engine's CUDA graphs outside
    the allocator)."""
    from tunekit.estimate.memory import model_shape
    from tunekit.metrics import GIB

    r = load_recipe("smollm2-arith", sets)
    peak = estimate_memory(r, model_shape(r), 141.0, traits=runner_for(r).traits).peak / GIB
    assert peak == pytest.approx(measured_gib, rel=0.06)


def test_an_engine_that_captures_cuda_graphs_adds_memory_outside_the_allocator():
    eager, graphed = (_est(f"system.rollout.enforce_eager={e}") for e in ("true", "false"))
    assert graphed.gpus[0].outside - eager.gpus[0].outside == pytest.approx(2.45 * 2**30)
    hf = _est("system.rollout.backend=hf", "system.rollout.enforce_eager=false")  # no engine: nothing captured
    trl = _est("runner=trl", "system.rollout.enforce_eager=false")  # TRL's engine: within 0.3% without it
    assert hf.gpus[0].outside == trl.gpus[0].outside == pytest.approx(CONTEXT)


def test_auto_leaves_the_graphs_out_where_their_pool_tips_the_card_and_true_keeps_them():
    from tunekit.estimate.memory import graphs_for_card, graphs_left_out, would_not_fit

    # the 1.5B preset with HF generation beside PPO's three models: about 74 GiB without the graphs' pool, 87 with it
    r = load_recipe("qwen2.5-1.5b")
    t = runner_for(r).traits
    assert graphs_left_out(r, 80, traits=t) and not graphs_left_out(r, 141, traits=t)
    assert would_not_fit(r, 80, traits=t) is None  # estimated as it will run: without the graphs
    assert would_not_fit(load_recipe("qwen2.5-1.5b", ["system.cuda_graphs=true"]), 80, traits=t) is not None
    settled = graphs_for_card(r, 80, traits=t)
    assert settled.system.cuda_graphs is False and r.system.cuda_graphs == "auto"
    assert graphs_for_card(r, 141, traits=t) is r
    forced = load_recipe("qwen2.5-1.5b", ["system.cuda_graphs=true"])
    assert graphs_for_card(forced, 80, traits=t) is forced
    fsdp = load_recipe("qwen2.5-1.5b", ["system.memory.fsdp_single_gpu=true"])  # nothing graphed: nothing to settle
    assert not graphs_left_out(fsdp, 80, traits=t) and graphs_for_card(fsdp, 80, traits=t) is fsdp


def test_a_datasets_prompts_are_as_long_as_its_longest_row_fed_to_the_model(tmp_path):
    """With a dataset, the activations, KV cache and cost model count its longest prompt as the model is fed it, not
    the engine's whole prompt budget (which made a SmolLM2 probe's estimate 29% over its measured peak); a dataset
    the estimate cannot read here leaves the budget, an upper bound."""
    import json

    from tunekit.config import PROMPT_TOKEN_BUDGET
    from tunekit.estimate.memory import prompt_tokens

    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "12+30+7=", "answer": "49"}, {"prompt": "9-4=", "answer": "5"}]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the embedded tokenizer: one token a character, no chat template
    assert prompt_tokens(load_recipe(None, [f"task.dataset={data}"])) == len("12+30+7=")
    # a template counts as the rows fill it (in characters the embedded tokenizer knows)
    templated = load_recipe(None, [f"task.dataset={data}", "task.prompt_template={answer}+{prompt}"])
    assert prompt_tokens(templated) == len("49+12+30+7=")
    missing = load_recipe(None, [f"task.dataset={tmp_path / 'gone.jsonl'}"])
    assert prompt_tokens(missing) == PROMPT_TOKEN_BUDGET
    short = _est(f"task.dataset={data}").roles[0].activations
    assert short < _est(f"task.dataset={tmp_path / 'gone.jsonl'}").roles[0].activations


def test_the_estimate_counts_what_a_runners_traits_say_whatever_its_name():
    """A runner's rules reach the estimate as its traits (:attr:`tunekit.runners.base.Runner.traits`), not by its
    name."""
    from dataclasses import replace

    from tunekit.runners import RUNNERS

    r = load_recipe(None, BASE + ["runner=trl", "system.rollout.enforce_eager=false"])
    trl = RUNNERS["trl"].traits
    lent = estimate_memory(r, SHAPE, CARD, traits=replace(trl, engine_graphs_outside=True))
    assert lent.gpus[0].outside - estimate_memory(r, SHAPE, CARD, traits=trl).gpus[0].outside == pytest.approx(2.45 * 2**30)
    assert runner_for(r).traits is trl
