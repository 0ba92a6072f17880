"""The cost model: its counts, how phases scale with batch, hardware and GPUs, the calibration fit, the command's
output and bad input, and the search's skip rule. All on CPU, from recipes and synthetic run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.estimate import cost
from tunekit.estimate.costmodel import calibrate, predict
from tunekit.estimate.costmodel.calibrate import Calibration, Fit, Point, fit
from tunekit.estimate.costmodel.predict import unfitted
from tunekit.estimate.costmodel.model import (
    DEFAULT_EFFICIENCY,
    PhaseWork,
    block_matmul_params,
    decode_bytes,
    default_efficiency,
    fsdp_bytes,
    hardware,
    pass_flops,
    phases,
    stream_bytes,
    training_path,
)
from tunekit.estimate.memory import GIB, ModelShape, estimate_memory, model_shape
from tunekit.estimate.profiles import load_profile
from tunekit.rundir import write_config
from tunekit.runners import runner_for
from tunekit.search.screen import too_costly
from tunekit.search.budget import PruneBar

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
ONE = "system.device_map={actor: [0], critic: [0], ref: [0], rollout: [0], reward: [0]}"
TWO = "system.device_map={actor: [0,1], critic: [0,1], ref: [0,1], rollout: [0,1], reward: [0,1]}"


def _phases(recipe, profile):
    return {n: w.seconds(0.5) for n, w in phases(recipe, model_shape(recipe), hardware(load_profile(profile))).items()}


# ---------------------------------------------------------------- counts


def test_counts_by_hand():
    # 2 rows, 3 prompt tokens, 2 new: contexts 4 and 5 per row -> 18 tokens read, 4 bytes each; weights 10 x 2 bytes a step
    assert decode_bytes(n_params=10, kv_bytes_per_token=4, rows=2, prompt=3, new=2, waves=1) == 2 * 20 + 18 * 4
    assert decode_bytes(n_params=10, kv_bytes_per_token=4, rows=2, prompt=3, new=2, waves=3) == 6 * 20 + 18 * 4
    # 4 GPUs: each sends 3/4 of two bf16 gathers and one fp32 reduce-scatter of 100 parameters
    assert fsdp_bytes(100, 4, gathers=2, reduce=True) == pytest.approx(0.75 * (200 + 200 + 400))
    assert fsdp_bytes(100, 1, gathers=2, reduce=True) == 0
    # 2 layers of hidden 4, key/value width 2, MLP 8: q, o 16 each, k, v 8 each, gate, up, down 32 each = 144 a layer
    toy = ModelShape(n_params=0, n_layers=2, hidden=4, vocab=10, kv_dim=2, intermediate=8)
    assert block_matmul_params(toy) == 288
    # forward and backward (3 forwards' worth) of 5 tokens, 3 of them through the 10 x 4 head: 3 x 2 x (288 x 5 + 40 x 3)
    assert pass_flops(toy, tokens=5, head_tokens=3, passes=3) == 9360
    # a block's forward moves 108 x 4 + 20 x 2 + 10 x 8 = 552 bytes a token; 2 blocks x 5 tokens = 5520, the backward
    # twice that again (16560 in all); the log-probability 38 bytes a vocabulary entry forward, 54 backward, 3 tokens
    assert stream_bytes(toy, tokens=5, head_tokens=3, backward=False) == 5520 + 38 * 30
    assert stream_bytes(toy, tokens=5, head_tokens=3, backward=True) == 16560 + 92 * 30


def test_decode_reads_the_weights_once_per_step_for_the_whole_batch():
    small = _phases(load_recipe("qwen2.5-1.5b", ["system.batch.prompts_per_step=64"]), "h200")
    large = _phases(load_recipe("qwen2.5-1.5b", ["system.batch.prompts_per_step=128"]), "h200")
    assert large["gen"] / small["gen"] < 1.3  # memory bound: twice the rows, far less than twice the time
    assert large["update_actor"] / small["update_actor"] == pytest.approx(2.0, rel=0.05)  # compute bound


def test_gpu_types_scale_decode_by_bandwidth_and_the_update_by_peak_flops():
    r = load_recipe("qwen2.5-1.5b", ["task.max_new_tokens=512", "system.batch.prompts_per_step=16"])
    h200, a100 = _phases(r, "h200"), _phases(r, "a100-80g")
    assert 2.3 < a100["gen"] / h200["gen"] < 2.45  # 4.8 TB/s against 2.039
    hw = {name: phases(r, model_shape(r), hardware(load_profile(name)))["update_actor"] for name in ("h200", "a100-80g")}
    assert 3.1 < hw["a100-80g"].ideal_s / hw["h200"].ideal_s < 3.25  # matmuls: 989 TFLOP/s against 312
    traffic = {k: {n: v for _, n, v in w.terms}["elementwise traffic"] for k, w in hw.items()}
    assert 2.3 < traffic["a100-80g"] / traffic["h200"] < 2.45  # elementwise traffic: the bandwidths
    assert 2.3 < a100["update_actor"] / h200["update_actor"] < 3.1  # the update between the two


def test_two_gpus_halve_the_update_compute_and_add_fsdp_traffic():
    one = phases(r1 := load_recipe("qwen2.5-1.5b", [ONE]), model_shape(r1), hardware(load_profile("h100-80g")))
    two = phases(r2 := load_recipe("qwen2.5-1.5b", [TWO]), model_shape(r2), hardware(load_profile("h100-80g")))
    assert two["update_actor"].ideal_s == pytest.approx(one["update_actor"].ideal_s / 2)
    assert two["update_actor"].offset_s > one["update_actor"].offset_s
    # one engine over both GPUs: each reads half the weights a decode step, and all-reduces over the link
    tp = phases(r3 := load_recipe("qwen2.5-7b", ["system.rollout.tensor_parallel_size=2"]), model_shape(r3),
                hardware(load_profile("h100-80g")))
    dp = phases(r4 := load_recipe("qwen2.5-7b", ["system.rollout.tensor_parallel_size=1"]), model_shape(r4),
                hardware(load_profile("h100-80g")))
    assert tp["gen"].ideal_s < dp["gen"].ideal_s and tp["gen"].offset_s > dp["gen"].offset_s


# ---------------------------------------------------------------- the fit


def test_fit_recovers_efficiency_and_launch_cost():
    # probes made with efficiency 0.4 and 2 ms a block pass, at work per launch differing 4x
    pts = [Point("g", 0.1 + ideal / 0.4 + launches * 0.002, 0.1, ideal, launches)
           for ideal, launches in ((1.0, 100), (1.0, 400), (2.0, 200))]
    f = fit(pts)
    assert f.efficiency == pytest.approx(0.4) and f.launch_s == pytest.approx(0.002) and f.probes == 3
    same = fit([Point("g", 2.0, 0, 1.0, 10), Point("g", 4.0, 0, 2.0, 20)])  # one work per launch: no launch cost
    assert same.launch_s == 0 and same.efficiency == pytest.approx(0.5)
    assert fit([Point("g", 1.0, 0, 0.0, 0)]) is None  # nothing to divide


def test_fit_on_a_cpu_takes_work_the_sum_cannot_see_at_the_peak():
    # a CPU issues and does the work itself, so launches and work add up; probes whose time does not grow with their
    # work leave the work at the peak and the launch cost fitted to the rest
    pts = [Point("g", launches * 0.004, 0.0, ideal, launches) for ideal, launches in ((0.0067, 96), (0.0134, 48), (1e-5, 8))]
    f = fit(pts)
    assert f.efficiency == 1.0 and f.launch_s == pytest.approx(0.004, rel=0.05) and f.low < 0.5


def test_fit_on_a_gpu_with_launch_bound_probes_keeps_the_default_and_says_so():
    # small eager probes on a big GPU: each block pass costs 4 ms on the host whatever its work, which the device does
    # meanwhile (the H200's 0.5B/embedded-model probes of the cost-model check looked like this)
    pts = [Point("update_actor", launches * 0.004, 0.0, ideal, launches, overlap=True)
           for ideal, launches in ((0.0067, 96), (0.0134, 48), (1e-5, 8))]
    f = fit(pts)
    assert f.launch_s == pytest.approx(0.004) and not f.seen
    assert f.efficiency == DEFAULT_EFFICIENCY["update_actor"] == f.low == f.high  # the work never showed
    bigger = PhaseWork("update_actor", ideal_s=0.042, launches=112)  # a larger preset, still launch-bound
    assert bigger.seconds(f.efficiency, f.launch_s, overlap=True) == pytest.approx(112 * 0.004)
    heavy = PhaseWork("update_actor", ideal_s=2.0, launches=112)  # work-bound: its work at the default efficiency
    assert heavy.seconds(f.efficiency, f.launch_s, overlap=True) == pytest.approx(2.0 / DEFAULT_EFFICIENCY["update_actor"])


def test_fit_on_a_gpu_reads_the_efficiency_from_work_bound_probes_and_the_launch_cost_from_the_others():
    # made with efficiency 0.4 and 2 ms a launch, the longer of the two: two probes are work-bound, one launch-bound
    made = [(1.0, 100), (2.0, 400), (0.1, 300)]
    pts = [Point("g", 0.1 + max(ideal / 0.4, launches * 0.002), 0.1, ideal, launches, overlap=True) for ideal, launches in made]
    f = fit(pts)
    assert f.seen and f.efficiency == pytest.approx(0.4) and f.launch_s == pytest.approx(0.002)
    assert f.low == pytest.approx(0.4) and f.high == pytest.approx(0.4)
    only_work = fit([Point("g", ideal / 0.5, 0.0, ideal, 10, overlap=True) for ideal in (1.0, 2.0)])
    assert only_work.seen and only_work.efficiency == pytest.approx(0.5) and only_work.launch_s == 0.0


def test_fit_on_a_gpu_splits_launches_into_block_passes_and_model_passes():
    # launch-bound probes made with 1.3 ms a block pass and 2.7 ms a model pass outside the blocks (sampling, LM head):
    # 64 decode steps of a 24-block model twice (batch sizes), and of a 2-block one, whose steps are mostly outside
    made = [(24, 64, 1e-4), (24, 64, 2e-4), (2, 64, 1e-5)]
    pts = [Point("gen/hf", blocks * passes * 0.0013 + passes * 0.0027, 0.0, ideal, blocks * passes, True, passes)
           for blocks, passes, ideal in made]
    f = fit(pts)
    assert f.launch_s == pytest.approx(0.0013) and f.pass_s == pytest.approx(0.0027) and not f.seen
    deeper = PhaseWork("gen/hf", ideal_s=1e-4, launches=28 * 64, passes=64)  # 28 blocks: priced at both rates
    assert deeper.seconds(f.efficiency, f.launch_s, True, f.pass_s) == pytest.approx(64 * (28 * 0.0013 + 0.0027))
    # one depth only: the two cannot be told apart, so the time stays a cost per block pass
    one = fit([Point("gen/hf", b * n * 0.004, 0.0, 1e-5, b * n, True, n) for b, n in ((24, 64), (24, 128))])
    assert one.pass_s == 0.0 and one.launch_s == pytest.approx(0.004)


def _probe_dir(root: Path, name: str, recipe, eff: float | None, profile: str = "h200", *, response: float | None = None,
               gen_extra_s: float = 0.0) -> Path:
    """A run directory whose steady phase times are the model's at efficiency ``eff`` (None: each group's stated
    one) on ``profile``, its training passes on the path its runner resolves there (recorded in its summary, as a
    probe records it); with ``response``, its responses that many tokens on average over its steady steps (the
    warm-up step's at the budget), and its generation ``gen_extra_s`` longer than the model's."""
    run = root / name
    run.mkdir(parents=True)
    write_config(run, recipe)
    hw = hardware(load_profile(profile))
    resolved = runner_for(recipe).training_path(recipe, gpu=hw.overlap)
    work = phases(recipe, model_shape(recipe), hw, path=training_path(recipe, gpu=hw.overlap, runners=runner_for, resolved=resolved),
                  old_logprob=resolved.get("resolved/old_logprob"), response=response)
    steady = {f"timing_s/{n}": w.seconds(default_efficiency(w.group) if eff is None else eff, overlap=hw.overlap)
              for n, w in work.items()}
    steady["timing_s/gen"] += gen_extra_s
    steady["timing_s/step"] = sum(steady.values()) + 0.01
    (run / "summary.json").write_text(json.dumps({"status": "ok", "profile": profile, "steady": steady, "wall_s": 40.0,
                                                  "startup_s": 20.0, **resolved}))
    steps = {"step": range(6), "timing_s/step": [steady["timing_s/step"]] * 6, "reward/mean": [0.5] * 6}
    if response is not None:
        steps["response_length/mean"] = [float(recipe.task.max_new_tokens)] + [response] * 5
    pd.DataFrame(steps).to_parquet(run / "steps.parquet")
    return run


def test_calibration_fits_the_efficiency_the_probes_ran_at(tmp_path):
    for i, micro in enumerate((8, 32)):
        _probe_dir(tmp_path, f"p{i}", load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={micro}", ONE]), 0.25)
    broken = _probe_dir(tmp_path, "p9", load_recipe("qwen2.5-0.5b", [ONE]), 0.25)
    (broken / "summary.json").write_text("{broken")  # half written: left out, said, never a traceback
    cpu = _probe_dir(tmp_path, "p8", load_recipe("qwen2.5-0.5b", [ONE]), 0.25)
    (cpu / "summary.json").write_text(json.dumps(json.loads((cpu / "summary.json").read_text()) | {"profile": "cpu"}))
    cal = calibrate([tmp_path], runners=runner_for)
    assert any("p9" in why and "summary.json unreadable" in why for why in cal.left_out)
    # a probe made on the CPU: said to be one, not sent to a GPU datasheet
    (why,) = [w for w in cal.left_out if "p8" in w]
    assert "ran on the CPU, whose profile 'cpu' gives no peaks" in why and "datasheet" not in why
    # the preset's GPU defaults compile the training passes and replay them as CUDA graphs: a group of their own
    assert cal.n == 2 and cal.fits["update_actor/graphs"].efficiency == pytest.approx(0.25, rel=1e-3)
    assert cal.startup_s and all(s > 0 for s in cal.startup_s)
    r, h200 = load_recipe("qwen2.5-1.5b", [ONE]), load_profile("h200")
    target = predict(r, h200, cal, runners=runner_for)
    default = predict(r, h200, runners=runner_for)
    assert target.calibrated and not default.calibrated
    # 0.25 instead of the default: the calibrated update is the slower; the forward group is the critic's values pass
    t, d = ({p.name: p.seconds for p in x.phases} for x in (target, default))
    assert t["update_actor"] > 1.2 * d["update_actor"] and cal.fits["forward/graphs"].efficiency == pytest.approx(0.25, rel=1e-3)


def test_each_training_path_is_priced_and_calibrated_on_its_own(tmp_path):
    h200 = load_profile("h200")
    hw = hardware(h200)
    eager, graphed = (load_recipe("qwen2.5-1.5b", [ONE, f"system.compile={c}"]) for c in ("false", "auto"))
    assert (training_path(eager, gpu=True, runners=runner_for), training_path(graphed, gpu=True, runners=runner_for)) == ("eager", "graphs")
    assert training_path(graphed, gpu=False, runners=runner_for) == "eager"  # the same recipe on a CPU trains eager
    shape = model_shape(eager)
    e, c, g = (phases(eager, shape, hw, path=p)["update_actor"] for p in ("eager", "compiled", "graphs"))
    # the same matmuls; fused elementwise kernels move less; replayed graphs launch nothing block by block
    assert e.ideal_s == c.ideal_s == g.ideal_s and c.stream_s < 0.6 * e.stream_s and c.stream_s == g.stream_s
    assert e.launches == c.launches > 0 and g.launches == 0 and g.passes == e.passes
    # eager probes at 0.2 of the peak, graphed ones at 0.4: two fits, not one of both
    for i, micro in enumerate((8, 32)):
        for name, extra in (("e", "system.compile=false"), ("g", "system.compile=auto")):
            _probe_dir(tmp_path / name, f"p{i}", load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={micro}",
                                                                              ONE, extra]), 0.2 if name == "e" else 0.4)
    both = calibrate([tmp_path], runners=runner_for)
    assert both.fits["update_actor"].efficiency == pytest.approx(0.2, rel=1e-3)
    assert both.fits["update_actor/graphs"].efficiency == pytest.approx(0.4, rel=1e-3)
    fitted = {p.name: p.fitted_on for p in predict(graphed, h200, both, runners=runner_for).phases}
    assert (fitted["update_actor"], fitted["values"]) == ("update_actor/graphs", "forward/graphs")
    # with eager probes only, a graphed run is priced at their fit, says so, and the search's skip rule leaves it
    only_eager = calibrate([tmp_path / "e"], runners=runner_for)
    pred = predict(graphed, h200, only_eager, runners=runner_for)
    assert {p.fitted_on for p in pred.phases if p.name == "update_actor"} == {"update_actor"}
    assert "update_actor/graphs" in unfitted(pred)
    assert any(a.startswith("no probe ran forward/graphs, update_actor/graphs") for a in pred.assumptions)
    own = {p.name: p.seconds for p in predict(eager, h200, only_eager, runners=runner_for).phases}
    assert {p.name: p.seconds for p in pred.phases}["update_actor"] < own["update_actor"]  # less traffic, same fit


def test_the_model_asks_the_runner_it_is_handed():
    """The training path and the memory traits both come from the one runner the caller hands in, not from the
    recipe's ``runner`` key: a runner that trains eager is priced eager, its passes counted without graphs."""
    from dataclasses import replace

    r, h200 = load_recipe("qwen2.5-1.5b", [ONE]), load_profile("h200")
    builtin = runner_for(r)

    class Eager:
        traits = replace(builtin.traits, training_graphs=False)

        def training_path(self, recipe, *, gpu):
            return builtin.training_path(recipe, gpu=gpu) | {"resolved/compile": False, "resolved/cuda_graphs": False}

    own, eager = predict(r, h200, runners=runner_for), predict(r, h200, runners=lambda _: Eager())
    assert (own.path, eager.path) == ("graphs", "eager")
    assert training_path(r, gpu=True, runners=lambda _: Eager()) == "eager"
    assert any(x.graphed for x in own.memory.roles) and not any(x.graphed for x in eager.memory.roles)


# ---------------------------------------------------------------- the command


def test_estimate_on_a_gpu_type_prints_phases_memory_and_says_uncalibrated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-1.5b", "--gpu-profile", "h200"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "uncalibrated" in text and "update_actor" in text and "GPU 0 (actor, critic, rollout)" in text
    assert "full run: 1000 steps (64000 samples at 64 a step)" in text and "yuan" in text
    # the preset's defaults compile the training side on a GPU and replay it as CUDA graphs: priced so, and said
    assert "training passes compiled, replayed as CUDA graphs" in text and "update_actor/graphs" in text
    eager = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-1.5b", "--gpu-profile", "h200", "--set", "system.compile=false"])
    assert eager.exit_code == 0 and "training passes run eager" in " ".join(eager.output.split())


def test_estimate_says_calibrated_from_the_probes(tmp_path):
    for i, micro in enumerate((8, 32)):
        _probe_dir(tmp_path / "runs", f"p{i}", load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={micro}", ONE]), 0.25)
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-1.5b", "--gpu-profile", "h200", "--runs", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    assert "calibrated from 2 probe(s)" in " ".join(res.output.split())


def test_estimate_says_when_the_probes_were_launch_bound(tmp_path):
    # probes whose every block pass took 20 ms on the host, far more than its work: the efficiency never showed
    hw = hardware(load_profile("h200"))
    for i, micro in enumerate((8, 32)):
        recipe = load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={micro}", ONE, "system.compile=false"])
        run = tmp_path / "runs" / f"p{i}"
        run.mkdir(parents=True)
        write_config(run, recipe)
        steady = {f"timing_s/{n}": w.seconds(0.3, 0.02, overlap=True) for n, w in phases(recipe, model_shape(recipe), hw).items()}
        steady["timing_s/step"] = sum(steady.values())
        (run / "summary.json").write_text(json.dumps({"status": "ok", "profile": "h200", "steady": steady, "wall_s": 40.0}))
        pd.DataFrame({"timing_s/step": [steady["timing_s/step"]] * 6}).to_parquet(run / "steps.parquet")
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-1.5b", "--gpu-profile", "h200", "--runs", str(tmp_path / "runs"),
                              "--set", "system.compile=false"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    hidden = text[:text.index(": every probe was bound by its launches, so its work never showed")].rsplit("assumed: ", 1)[1]
    assert "update_actor" in hidden.split(", ")
    assert "20 ms a block pass, whichever is longer" in text


def test_compare_profiles_ranks_gpu_types_and_puts_what_would_not_fit_last(tmp_path, monkeypatch):
    from tunekit.cli import out

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(out, "width", 200)
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-1.5b", "--compare-profiles", "a10,a100-80g,h100-80g,h200"])
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.output.splitlines() if line.strip()[:1].isdigit()]
    assert [r[1] for r in rows][-1] == "a10" and "would not fit" in " ".join(rows[-1])
    fits = [r for r in rows if "fits" in r or "tight" in r]  # 74 GiB: tight on the 80 GiB cards
    yuan = [float(r[7]) for r in fits]
    assert len(fits) == 3 and yuan == sorted(yuan)


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpu-profile", "no-such-gpu"], "No price profile named 'no-such-gpu'"),
    (["--compare-profiles", "h200,cpu"], "price profile 'cpu' has no peak_bf16_tflops"),
    (["--gpu-profile", "h200", "--set", "model.preset=no-such-preset"], "model.preset 'no-such-preset'"),
    (["--gpu-profile", "h200", "--runs", "no-such-dir"], "--runs no-such-dir: no such directory"),
])
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-0.5b", *args])
    assert res.exit_code == 2, res.output
    assert needle in " ".join(res.output.split()) and res.output.count("error:") == 1


def test_a_profile_without_bandwidths_is_named(tmp_path):
    card = yaml.safe_load((ROOT / "profiles" / "h200.yaml").read_text()) | {"name": "old-card"}
    del card["hbm_bandwidth_gbs"]
    (tmp_path / "old-card.yaml").write_text(yaml.safe_dump(card))
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-0.5b", "--gpu-profile", str(tmp_path / "old-card.yaml")])
    assert res.exit_code == 2 and "'old-card' has no hbm_bandwidth_gbs" in " ".join(res.output.split())


def test_two_profiles_of_one_name_are_refused_in_a_comparison(tmp_path):
    card = yaml.safe_load((ROOT / "profiles" / "l40s.yaml").read_text()) | {"name": "h100-80g"}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(card))
    res = runner.invoke(app, ["estimate", "--recipe", "qwen2.5-0.5b", "--compare-profiles", f"h100-80g,{tmp_path / 'mine.yaml'}"])
    assert res.exit_code == 2
    assert " ".join(res.output.split()) == (f"error: --compare-profiles: h100-80g and {tmp_path / 'mine.yaml'} are both "
                                            "named 'h100-80g'; give each profile its own name (its name key), so the "
                                            "rows can be told apart.")


def test_a_gpu_profile_without_an_nvml_pattern_says_it_is_a_gpus_or_is_said_to_be_priced_as_a_cpu(tmp_path):
    """null is how a profile says a value is unknown: a card whose NVML name the user does not know is a GPU when
    its profile says ``device: gpu``, priced as one; without it, the estimate says it priced a CPU, which does its
    launches and its work one after the other."""
    card = yaml.safe_load((ROOT / "profiles" / "h200.yaml").read_text())
    for name, sets in (("named", {}), ("unnamed", {"nvml_pattern": None, "device": "gpu"}),
                       ("unsaid", {"nvml_pattern": None})):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(card | {"name": name} | sets))
    named, unnamed, unsaid = (predict(load_recipe("qwen2.5-1.5b", [ONE]), load_profile(str(tmp_path / f"{n}.yaml")),
                                      runners=runner_for) for n in ("named", "unnamed", "unsaid"))
    assert unnamed.step_s == pytest.approx(named.step_s) and unnamed.path == named.path == "graphs"
    assert unsaid.step_s > named.step_s and unsaid.path == "eager"
    assert any(a.startswith("unsaid priced as a CPU") and "`device: gpu`" in a for a in unsaid.assumptions)
    assert not any("priced as a CPU" in a for a in named.assumptions) and not load_profile("cpu").is_gpu


def test_the_cost_model_prices_the_path_a_probe_on_the_card_runs():
    """On an 80 GiB card the 1.5B preset's CUDA graphs are left out (their pool is what would tip it), so a probe
    there runs compiled without them; the estimate prices that path, as the memory verdict counts it, and on the
    141 GiB card the graphs."""
    r = load_recipe("qwen2.5-1.5b", [ONE])
    small, large = (predict(r, load_profile(n), runners=runner_for) for n in ("h100-80g", "h200"))
    unplanned = predict(load_recipe("qwen2.5-1.5b", [ONE, "system.cuda_graphs=false"]), load_profile("h100-80g"),
                        runners=runner_for)
    assert (small.path, large.path) == ("compiled", "graphs") and small.step_s == pytest.approx(unplanned.step_s)


# ---------------------------------------------------------------- the search's skip rule


def test_search_skips_only_with_two_calibrating_probes_and_a_far_lower_best(tmp_path):
    dirs = [str(_probe_dir(tmp_path, f"p{i}", load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={m}", ONE]), 0.3))
            for i, m in enumerate((8, 32))]
    h200 = load_profile("h200")
    cand = load_recipe("qwen2.5-0.5b", ["system.batch.micro_batch_size=16", ONE])
    cal = calibrate([Path(d) for d in dirs], measured_on=h200, runners=runner_for)
    own = predict(cand, h200, cal, runners=runner_for).yuan_low
    why = too_costly(cand, h200, dirs, PruneBar(own / 3, 2, None))
    assert why is not None and why.startswith("estimated too costly") and "the best feasible (trial 2" in why
    assert too_costly(cand, h200, dirs, PruneBar(own / 1.5, 2, None)) is None  # within 2x of the best: probe it
    assert too_costly(cand, h200, dirs[:1], PruneBar(own / 3, 2, None)) is None  # one probe calibrates nothing
    assert too_costly(cand, h200, dirs, None) is None  # no bar yet
    off = load_recipe("qwen2.5-0.5b", ["system.batch.micro_batch_size=16", ONE, "search.skip_by_estimate=false"])
    assert too_costly(off, h200, dirs, PruneBar(own / 3, 2, None)) is None
    vllm = load_recipe("qwen2.5-0.5b", ["system.batch.micro_batch_size=16", ONE, "system.rollout.backend=vllm"])
    assert too_costly(vllm, h200, dirs, PruneBar(own / 100, 2, None)) is None  # no probe calibrated the engine's decode


def test_a_run_to_the_threshold_is_screened_over_the_run_length_its_learning_took(tmp_path):
    """A run that lasts until the threshold has no length before its probe, unless a trial of its learning lends
    one (the length the probe would be read with): then the screen prices it over those steps."""
    dirs = [str(_probe_dir(tmp_path, f"p{i}", load_recipe("qwen2.5-0.5b", [f"system.batch.micro_batch_size={m}", ONE]), 0.3))
            for i, m in enumerate((8, 32))]
    h200 = load_profile("h200")
    cand = load_recipe("qwen2.5-0.5b", ["system.batch.micro_batch_size=16", ONE, "run.until=threshold"])
    cal = calibrate([Path(d) for d in dirs], measured_on=h200, runners=runner_for)
    over40 = predict(cand, h200, cal, cost.RunLength(40, "lent"), runners=runner_for).yuan_low
    assert too_costly(cand, h200, dirs, PruneBar(over40 / 3, 5, None)) is None  # no run length: only its probe can tell
    why = too_costly(cand, h200, dirs, PruneBar(over40 / 3, 5, 40))
    assert why is not None and "over 40 steps" in why and "trial 5's" in why and "whose learning it shares" in why
    assert too_costly(cand, h200, dirs, PruneBar(over40, 5, 40)) is None  # within 2x of its learning's bar


# ---------------------------------------------------------------- size: matmuls and elementwise traffic

WORK_BOUND = ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=64", "task.max_new_tokens=256", ONE]


def test_one_calibration_prices_a_larger_model_at_a_higher_share_of_the_peak(tmp_path):
    # probes of the 0.5B preset at a matmul efficiency of 0.4; the same fit prices each larger preset's update
    for i, micro in enumerate((32, 64)):
        _probe_dir(tmp_path, f"p{i}", load_recipe("qwen2.5-0.5b", [*WORK_BOUND, f"system.batch.micro_batch_size={micro}"]), 0.4)
    cal = calibrate([tmp_path], runners=runner_for)
    assert cal.fits["update_actor/graphs"].efficiency == pytest.approx(0.4, rel=1e-3)
    h200 = load_profile("h200")
    mfu = []
    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"):
        r = load_recipe("qwen2.5-1.5b", [*WORK_BOUND, f"model.preset={preset}"])
        shape = model_shape(r)
        pred = predict(r, h200, cal, runners=runner_for)
        seconds = {p.name: p.seconds for p in pred.phases}["update_actor"]
        tokens = 64 * (6 + 256)  # six prompt tokens (two 2-digit operands, '+', '='), 256 new
        mfu.append(6 * shape.n_params * tokens / (989e12 * seconds))
    assert mfu == sorted(mfu) and mfu[-1] > 1.3 * mfu[0]  # the matmuls' share of the pass grows with the width


def test_qwen25_3b_preset_has_the_published_shapes():
    from tunekit.workload import models

    c = models.build_config("qwen2.5-3b")
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, c.intermediate_size) == ("qwen2", 2048, 36, 11008)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings) == (16, 2, 151936, True)
    # by hand: embedding 151936 x 2048 = 311,164,928; a layer q 2048^2 + 2048, k and v 2048 x 256 + 256 each, o 2048^2,
    # MLP 3 x 2048 x 11008, two norms 2048 each = 77,076,992, x 36; the final norm 2048: 3.09B, as Qwen publishes
    assert models.memory_shape(None, "qwen2.5-3b")["n_params"] == 3_085_938_688


def _estimator_check():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import estimator_check

    return estimator_check


def _check_recipe(ec, ref, extra):
    return load_recipe(ref, [c.format(steps=6, timeout=300) for c in ec.COMMON] + [f"system.device_map={ec.ALL1}", *extra])


def test_the_3b_target_of_the_estimator_check_fits_one_h200_and_runs_a_reference():
    ec = _estimator_check()
    ((label, ref, extra),) = ec.chosen_targets(ec.GPU["targets"], "3b")
    r = _check_recipe(ec, ref, extra)
    assert r.model.preset == "qwen2.5-3b" and r.algorithm.uses_ref and not r.algorithm.uses_critic
    assert r.system.compile is False and r.task.max_new_tokens == 64 and r.task.fixed_length
    est = estimate_memory(r, model_shape(r), load_profile("h200").memory_gib, traits=runner_for(r).traits)
    assert est.verdict == "fits" and est.peak / GIB <= 110
    assert [t[0] for t in ec.chosen_targets(ec.GPU["targets"], "1.5b")] == ["1.5b-p64-m16", "1.5b-p64-m32-t256"]


def test_refit_of_the_blind_1_5b_check_from_its_stored_efficiencies():
    """Post hoc, not blind. The stored calibration (benchmarks/results/estimator_check.json, the refit whose
    predictions the blind check probed) holds each training phase's efficiency with low == high: one work-bound probe,
    the 0.5B preset at 64 x 64 x 256 tokens, set it, so its measured time is the old count at that efficiency. That
    time refits the matmul efficiency of the current model, which then predicts the blind target."""
    ec = _estimator_check()
    entries = json.loads((ROOT / "benchmarks" / "results" / "estimator_check.json").read_text())
    refit = [e["table"] for e in entries if "1.5b-p64-m32-t256" in e["table"].get("predicted_before_probe", {})][-1]
    blind = [e["table"]["blind_check"] for e in entries if "blind_check" in e["table"]][-1]["phases"]
    h200 = load_profile("h200")
    hw = hardware(h200)
    probe = _check_recipe(ec, "qwen2.5-0.5b", ec.WORK)
    target = _check_recipe(ec, "qwen2.5-1.5b", ["system.batch.prompts_per_step=64", "system.batch.micro_batch_size=32",
                                                "task.max_new_tokens=256"])

    def old_count(recipe):
        """The old model's (ideal, offset): 6 N a token for an update (N - vocab x hidden for the critic), 2 N for
        values, the AdamW step's 7 fp32 tensors at 0.7 of the bandwidth."""
        shape = model_shape(recipe)
        n, head = shape.n_params, shape.vocab * shape.hidden
        tokens = recipe.system.batch.samples_per_step * (6 + recipe.task.max_new_tokens)
        adam = 28 * n / (hw.hbm * 0.7)
        return {"update_actor": (6 * n * tokens / hw.flops, adam), "update_critic": (6 * (n - head) * tokens / hw.flops, adam),
                "values": (2 * (n - head) * tokens / hw.flops, 0.0)}

    stored = refit["calibration"]
    old_target = {k: off + ideal / stored[k]["eff"] for k, (ideal, off) in old_count(target).items()}
    for k, v in old_target.items():  # the reconstruction gives back what the old model predicted
        assert v == pytest.approx(refit["predicted_before_probe"]["1.5b-p64-m32-t256"]["phases"][k], rel=2e-3)
    measured = {k: off + ideal / stored[k]["eff"] for k, (ideal, off) in old_count(probe).items()}
    work = phases(probe, model_shape(probe), hw)
    cal = Calibration(probes=[Path("0.5b-p64-m64-t256")])
    for k, y in measured.items():
        w, s = work[k], stored[k]
        f = fit([Point(w.group, y, w.offset_s, w.ideal_s, 0.0, True, 0.0, w.stream_s)])  # work-bound: no launch term
        cal.fits[w.group] = Fit(f.efficiency, s["launch_ms"] / 1e3, f.efficiency, f.efficiency, 1, True, s["pass_ms"] / 1e3)
    new = {p.name: p.seconds for p in predict(target, h200, cal, runners=runner_for).phases}
    for k in measured:
        old_err = abs(blind[k]["pred_s"] - blind[k]["meas_s"]) / blind[k]["meas_s"]
        new_err = abs(new[k] - blind[k]["meas_s"]) / blind[k]["meas_s"]
        assert new_err < old_err - 0.2, (k, new[k], blind[k]["meas_s"])


def test_what_the_model_does_not_price_is_said():
    """Without a probe HF generate's launches, the held-out evaluations and an external server's GPUs are left out
    of the price; each prediction says which, and a vLLM engine's stated host costs need no such line."""
    h200 = load_profile("h200")
    hf = predict(load_recipe("qwen2.5-0.5b", [ONE, "system.rollout.backend=hf", "probe.eval_every=5",
                                              "task.eval_fraction=0.1"]), h200, runners=runner_for)
    said = " ".join(hf.assumptions)
    assert "HF generate's launches are not priced" in said and "evaluations (every 5 steps) are not priced" in said
    engine = predict(load_recipe("qwen2.5-0.5b", [ONE, "system.rollout.backend=vllm"]), h200, runners=runner_for)
    assert not any("not priced" in line for line in engine.assumptions)
    served = predict(load_recipe("qwen2.5-0.5b", [ONE, "system.rollout.backend=vllm_server",
                                                  "system.rollout.server_url=http://10.0.0.9:8000"]), h200,
                     runners=runner_for)
    assert any("rollout server at system.rollout.server_url is not priced" in line for line in served.assumptions)


def test_a_runners_old_logprob_time_without_the_forward_is_not_fitted_as_one():
    """TRL times the rest of its batch scoring as ``timing_s/old_logprob`` where it runs no old-policy forward
    (its summary's ``resolved/old_logprob`` false): that time is not fitted as an actor forward's."""
    from tunekit.estimate.costmodel.calibrate import probe_points
    from tunekit.estimate.costmodel.model import hardware

    r = load_recipe("qwen2.5-0.5b", [ONE, "algorithm.name=grpo", "system.batch.samples_per_prompt=4"])
    hw = hardware(load_profile("h200"))
    steady = {"timing_s/gen": 1.0, "timing_s/old_logprob": 0.005, "timing_s/update_actor": 0.5, "timing_s/step": 1.6}
    with_forward, _ = probe_points(r, steady, hw, old_logprob=True)
    without, rest = probe_points(r, steady, hw, old_logprob=False)
    assert len(with_forward) == len(without) + 1  # the forward's point only where it ran
    assert sorted(p.measured for p in without) == [0.5, 1.0]
    # and its seconds count as the step's time outside the modelled phases
    assert rest == pytest.approx((1.6 - 1.5) / (r.system.batch.samples_per_step))


def test_calibration_fits_an_old_logprob_forward_only_where_the_probe_ran_one(tmp_path):
    """A probe whose summary says it ran no old-policy forward, but which timed ``timing_s/old_logprob`` (TRL's
    scoring of the batch), gives the forward group no point."""
    r = load_recipe("qwen2.5-0.5b", [ONE, "algorithm.name=grpo", "system.batch.samples_per_prompt=4",
                                     "algorithm.kl_coef=0"])
    run = _probe_dir(tmp_path, "p0", r, 0.25)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resolved/old_logprob"] is False and "timing_s/old_logprob" not in summary["steady"]
    summary["steady"]["timing_s/old_logprob"] = 0.005  # another runner's time under that name
    (run / "summary.json").write_text(json.dumps(summary))
    cal = calibrate([tmp_path], runners=runner_for)
    assert cal.n == 1 and not [g for g in cal.fits if g.startswith("forward")]
