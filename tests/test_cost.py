"""Cost arithmetic against hand-computed numbers, and the shipped price profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunekit.estimate.cost import one_time_s, probe_spend, project_run, yuan_per_step
from tunekit.config.errors import TunekitError
from tunekit.estimate.profiles import PROFILES_DIR, PriceProfile, list_profiles, load_profile, match_profile

A100_40G = PriceProfile(
    name="test-a100",
    nvml_pattern=None,
    memory_gib=40,
    peak_bf16_tflops=312,
    yuan_per_gpu_hour=8.5,
    price_source="test",
    peak_source="test",
)

VALID_YAML = """\
name: my-gpu
nvml_pattern: "MyGPU"
memory_gib: 16
peak_bf16_tflops: null
yuan_per_gpu_hour: 1.5
price_source: "my invoice"
peak_source: "unknown"
"""


def _write(tmp_path: Path, text: str, name: str = "my-gpu.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- cost arithmetic -------------------------------------------------------


def test_probe_spend_one_hour_two_gpus() -> None:
    spend = probe_spend(3600.0, 2, A100_40G)
    assert spend.gpu_hours == pytest.approx(2.0)
    assert spend.yuan == pytest.approx(17.0)  # 1 h x 2 GPUs x 8.5


def test_yuan_is_seconds_times_gpus_times_price_and_affordable_s_inverts_it() -> None:
    from tunekit.estimate.cost import affordable_s, yuan

    assert yuan(1800.0, 4, A100_40G) == pytest.approx(17.0)  # half an hour x 4 GPUs x 8.5 yuan/h
    assert affordable_s(17.0, 4, A100_40G) == pytest.approx(1800.0)


def test_probe_spend_short_probe() -> None:
    spend = probe_spend(90.0, 4, A100_40G)
    assert spend.gpu_hours == pytest.approx(0.1)  # 90/3600 x 4
    assert spend.yuan == pytest.approx(0.85)


def test_project_run_excludes_warmup_and_prices_steady_steps_at_their_mean() -> None:
    # Warm-up steps are slow (compile, allocator growth); steady ones are 2, 3 and a slow 7 s (right-skewed:
    # median 3 s, mean 4 s). A run's wall time is the sum of its steps, so the mean is what it pays.
    steps = [30.0, 20.0, 2.0, 3.0, 7.0]
    with_warmup = project_run(
        startup_s=0.0, step_times_s=steps, warmup_steps=0, target_steps=1,
        gpus_held=1, profile=A100_40G,
    )
    steady = project_run(
        startup_s=120.0, step_times_s=steps, warmup_steps=2, target_steps=1000,
        gpus_held=2, profile=A100_40G,
    )
    assert with_warmup.mean_step_s == pytest.approx(62.0 / 5)
    assert steady.mean_step_s == pytest.approx(4.0)
    assert steady.steady_steps == 3
    assert not steady.extrapolated_from_warmup
    # the run pays its two warm-up steps as measured, the other 998 at the mean
    assert steady.wall_s == pytest.approx(120.0 + 30.0 + 20.0 + 998 * 4.0)  # 4162 s
    assert steady.gpu_hours == pytest.approx(4162.0 / 3600.0 * 2)
    assert steady.yuan == pytest.approx(4162.0 / 3600.0 * 2 * 8.5)


def test_run_length_is_work_not_a_step_count() -> None:
    from tunekit.estimate.cost import run_length, steps_to_threshold

    # 32000 samples: 1000 steps of 32, 2000 of 16, and a batch that does not divide rounds up
    by = dict(until="samples", samples=32000, rewards=[], threshold=0.5, window=2)
    assert [run_length(**by, samples_per_step=n).steps for n in (32, 16, 48)] == [1000, 2000, 667]
    # until the threshold: the first step whose 2-step mean reaches 0.5 (steps 4-5: 0.45, 0.6 -> 0.525)
    curve = [0.8, 0.1, 0.3, 0.45, 0.6, 0.2]
    assert steps_to_threshold(curve, 0.5, 2) == 5
    assert steps_to_threshold(curve, 0.5, 1) == 1  # a window of one step reads the raw curve
    assert steps_to_threshold(curve, 0.7, 2) is None
    assert steps_to_threshold([0.2, 0.6, 0.4], 0.5, 2) == 3  # a mean exactly on the threshold reaches it
    reached = run_length(until="threshold", samples=1, samples_per_step=32, rewards=curve, threshold=0.5, window=2)
    missed = run_length(until="threshold", samples=1, samples_per_step=32, rewards=curve, threshold=0.7, window=2)
    assert reached.steps == 5 and "step 5" in reached.rule
    assert missed.steps is None and "infeasible" in missed.rule


def test_fixed_cost_is_the_probe_outside_its_steps_and_its_profiler() -> None:
    from tunekit.estimate.cost import fixed_cost_s, project_probe

    # 40 s of wall: 25 s of steps, 5 s of profiler post-processing, so 10 s of start, imports and teardown
    assert fixed_cost_s(wall_s=40.0, startup_s=6.0, step_times_s=[5.0] * 5, profiler_s=5.0) == pytest.approx(10.0)
    # never below the start-up the trainer measured
    assert fixed_cost_s(wall_s=30.0, startup_s=6.0, step_times_s=[5.0] * 5, profiler_s=5.0) == pytest.approx(6.0)
    import pandas as pd

    steps = pd.DataFrame({"timing_s/step": [9.0, 4.0, 4.0, 4.0, 4.0], "profiler/overhead_s": [0.0, 2.0, 3.0, 0.0, 0.0]})
    p = project_probe(steps, wall_s=40.0, startup_s=6.0, warmup_steps=1, target_steps=100, gpus_held=1,
                      profile=A100_40G)
    assert p.wall_s == pytest.approx(40.0 - 25.0 - 5.0 + 9.0 + 99 * 4.0)


def test_a_run_evaluates_as_often_as_its_probe_did() -> None:
    """A probe of 5 steps that evaluated every 2 (twice, 1.5 s each, outside its steps): the 100-step run
    evaluates 50 times, 75 s, and its one-time cost holds none of it."""
    import pandas as pd

    from tunekit.estimate.cost import one_time_s, project_probe

    plain = pd.DataFrame({"timing_s/step": [9.0, 4.0, 4.0, 4.0, 4.0]})
    evaluated = plain.assign(**{"eval/time_s": [None, 1.5, None, 1.5, None]})
    kw = dict(startup_s=6.0, warmup_steps=1, target_steps=100, gpus_held=1, profile=A100_40G)
    p = project_probe(plain, wall_s=40.0, **kw)
    e = project_probe(evaluated, wall_s=43.0, eval_every=2, **kw)
    assert e.evaluation_s == pytest.approx(75.0) and e.wall_s == pytest.approx(p.wall_s + 75.0)
    assert one_time_s(e, 100) == pytest.approx(one_time_s(p, 100)) and e.yuan > p.yuan
    # priced with another probe's one-time cost, the evaluations are still the run's own
    lent = project_probe(evaluated, wall_s=43.0, overhead_s=50.0, eval_every=2, **kw)
    assert one_time_s(lent, 100) == pytest.approx(50.0) and lent.evaluation_s == pytest.approx(75.0)
    # on two GPUs every second of it is paid twice: the GPU-hours of the evaluated run's 495 s
    two = project_probe(evaluated, wall_s=43.0, eval_every=2, **(kw | {"gpus_held": 2}))
    assert two.wall_s == pytest.approx(e.wall_s) and two.gpu_hours == pytest.approx(2 * e.wall_s / 3600)
    assert e.wall_s == pytest.approx(6.0 + 9.0 + 99 * 4.0 + 75.0 + (43.0 - 25.0 - 3.0 - 6.0))
    # 7 steps evaluated every 3: two evaluations, where a share of the probe's steps would price 2 in 7
    seven = pd.DataFrame({"timing_s/step": [9.0] + [4.0] * 6, "eval/time_s": [None, None, 2.0, None, None, 4.0, None]})
    assert project_probe(seven, wall_s=50.0, eval_every=3, **kw).evaluation_s == pytest.approx(3.0 * 33)


def test_a_probe_no_longer_than_its_warm_up_pays_its_first_step_once() -> None:
    """Two steps against a warm-up of five: the first (compilation, graph capture) is paid once as measured and the
    second stands in for the steady ones, so a cold first step never becomes the price of every step."""
    projection = project_run(
        startup_s=10.0, step_times_s=[65.0, 7.0], warmup_steps=5, target_steps=100,
        gpus_held=1, profile=A100_40G,
    )
    assert projection.extrapolated_from_warmup and projection.steady_steps == 1
    assert projection.mean_step_s == pytest.approx(7.0)
    assert projection.wall_s == pytest.approx(10.0 + 65.0 + 99 * 7.0)
    assert one_time_s(projection, 100) == pytest.approx(10.0 + 65.0 - 7.0)  # the first step's excess is one-time
    one = project_run(startup_s=10.0, step_times_s=[65.0], warmup_steps=5, target_steps=100, gpus_held=1,
                      profile=A100_40G)
    assert one.extrapolated_from_warmup and one.wall_s == pytest.approx(10.0 + 100 * 65.0)  # nothing else to go by


def test_a_run_shorter_than_its_warm_up_pays_only_its_own_steps() -> None:
    # warm-up 3 of steps 30, 20, 10, then 2 s steps: a 2-step run pays the first two as measured, no step at the mean
    short = project_run(startup_s=5.0, step_times_s=[30.0, 20.0, 10.0, 2.0, 2.0], warmup_steps=3, target_steps=2,
                        gpus_held=1, profile=A100_40G)
    assert short.rest_steps == 0 and short.wall_s == pytest.approx(5.0 + 30.0 + 20.0)


def test_project_run_pays_for_idle_held_gpus() -> None:
    kwargs = dict(startup_s=0.0, step_times_s=[1.0, 1.0], warmup_steps=0, target_steps=3600)
    one = project_run(**kwargs, gpus_held=1, profile=A100_40G)
    four = project_run(**kwargs, gpus_held=4, profile=A100_40G)
    assert one.wall_s == four.wall_s
    assert four.yuan == pytest.approx(4 * one.yuan) == pytest.approx(34.0)


@pytest.mark.parametrize(
    "bad",
    [
        dict(step_times_s=[]),
        dict(warmup_steps=-1),
        dict(target_steps=-1),
        dict(gpus_held=0),
        dict(startup_s=-1.0),
        dict(step_times_s=[1.0, float("nan")]),
    ],
)
def test_project_run_rejects_bad_input(bad: dict) -> None:
    kwargs = dict(
        startup_s=0.0, step_times_s=[1.0], warmup_steps=0, target_steps=10,
        gpus_held=1, profile=A100_40G,
    )
    with pytest.raises(ValueError):
        project_run(**{**kwargs, **bad})


def test_yuan_per_step() -> None:
    # 36 s x 2 GPUs = 0.02 GPU-hours; x 8.5 yuan = 0.17
    assert yuan_per_step(36.0, 2, A100_40G) == pytest.approx(0.17)


# --- shipped profiles ------------------------------------------------------


def test_every_shipped_profile_loads_and_is_named_after_its_file() -> None:
    files = sorted(PROFILES_DIR.glob("*.yaml"))
    assert {p.stem for p in files} >= {
        "a100-40g", "a100-80g", "h100-80g", "h200", "l40s", "a10", "rtx-4090", "cpu",
    }
    for path in files:
        assert load_profile(path.stem).name == path.stem
        assert load_profile(path) == load_profile(path.stem)
    assert [p.name for p in list_profiles()] == [p.stem for p in files]


def test_every_shipped_price_says_where_it_comes_from_and_when() -> None:
    for profile in list_profiles():
        source = profile.price_source
        assert source.startswith(("https://", "http://", "Estimate")), (profile.name, source)
        assert profile.price_date is not None, profile.name


def test_shipped_prices_and_cpu_default() -> None:
    assert load_profile("a100-40g").yuan_per_gpu_hour == 8.5
    assert load_profile("a100-80g").yuan_per_gpu_hour == 14.2
    assert load_profile("h100-80g").yuan_per_gpu_hour == 22.5
    assert load_profile("h200").peak_bf16_tflops == 989
    assert "estimate" in load_profile("h200").price_source.lower()
    cpu = load_profile("cpu")
    assert cpu.nvml_pattern is None and cpu.peak_bf16_tflops is None


@pytest.mark.parametrize(
    ("nvml_name", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100-40g"),
        ("A100-SXM4-40GB", "a100-40g"),  # older drivers drop the vendor prefix
        ("NVIDIA A100-PCIE-40GB", "a100-40g"),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("NVIDIA A100 80GB PCIe", "a100-80g"),
        ("NVIDIA H100 80GB HBM3", "h100-80g"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("nvidia h200", "h200"),  # case-insensitive
        # Different peaks: unknown rather than a wrong MFU.
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA L40", None),
        ("NVIDIA A10G", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("Tesla V100-SXM2-32GB", None),
        ("cpu", None),
    ],
)
def test_match_profile(nvml_name: str, expected: str | None) -> None:
    matched = match_profile(nvml_name)
    assert (matched.name if matched else None) == expected


def test_match_profile_refuses_ambiguous_patterns() -> None:
    loose = A100_40G.model_copy(update={"name": "loose", "nvml_pattern": "NVIDIA"})
    exact = A100_40G.model_copy(update={"name": "exact", "nvml_pattern": "H200"})
    with pytest.raises(TunekitError, match="loose, exact"):
        match_profile("NVIDIA H200", [loose, exact])


# --- profile errors ---------------------------------------------------------


def test_user_profile_by_path(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, VALID_YAML))
    assert profile.name == "my-gpu" and profile.yuan_per_gpu_hour == 1.5
    assert match_profile("Acme MyGPU 16GB", [profile]) == profile


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: [unclosed\n", "not valid YAML at line"),
        (VALID_YAML + "price_per_hour: 3\n", "unknown key 'price_per_hour'"),
        (VALID_YAML.replace("yuan_per_gpu_hour: 1.5", "yuan_per_gpu_hour: '1.5'"),
         "key 'yuan_per_gpu_hour' must be a number > 0"),
        (VALID_YAML.replace("yuan_per_gpu_hour: 1.5", "yuan_per_gpu_hour: 0"),
         "key 'yuan_per_gpu_hour' must be a number > 0"),
        (VALID_YAML.replace("memory_gib: 16", "memory_gib: sixteen"),
         "key 'memory_gib' must be null or a number > 0"),
        (VALID_YAML.replace("peak_bf16_tflops: null\n", ""), "missing key 'peak_bf16_tflops'"),
        (VALID_YAML.replace("peak_bf16_tflops: null\n", "").replace('price_source: "my invoice"\n', ""),
         "missing keys 'peak_bf16_tflops', 'price_source' — add them"),
        (VALID_YAML.replace('"MyGPU"', '"My(GPU"'),
         "key 'nvml_pattern' is not a valid regular expression"),
        (VALID_YAML.replace('"MyGPU"', '""'), "key 'nvml_pattern' must be null or a non-empty string"),
        ("- a list\n", "must be a mapping"),
        ("", "must be a mapping"),
    ],
)
def test_bad_profile_names_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = _write(tmp_path, text, name="broken.yaml")
    with pytest.raises(TunekitError) as info:
        load_profile(path)
    message = info.value.message
    assert "broken.yaml" in message
    assert fragment in message
    assert "\n" not in message


def test_unknown_profile_name_lists_available() -> None:
    with pytest.raises(TunekitError) as info:
        load_profile("b200")
    assert "'b200'" in info.value.message
    assert "a100-40g" in info.value.message and "h200" in info.value.message


def test_missing_profile_path(tmp_path: Path) -> None:
    with pytest.raises(TunekitError, match="not found"):
        load_profile(tmp_path / "nope.yaml")


def test_projection_reads_warmup_and_unsampled_steps() -> None:
    import pandas as pd

    from tunekit.estimate.step_times import projection_step_times

    steps = pd.DataFrame({"timing_s/step": [9.0, 1.0, 3.0, 3.0, 1.0],
                          "comm/sampled": [float("nan"), float("nan"), 1.0, 1.0, float("nan")]})
    assert projection_step_times(steps, 2) == [9.0, 1.0, 1.0]
    every = pd.DataFrame({"timing_s/step": [9.0, 3.0], "comm/sampled": [float("nan"), 1.0]})
    assert projection_step_times(every, 1) == [9.0, 3.0]     # nothing unsampled after warm-up: keep them all
    assert projection_step_times(pd.DataFrame({"timing_s/step": [1.0, 2.0]}), 1) == [1.0, 2.0]
