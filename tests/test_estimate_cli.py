"""``tunekit estimate`` as a user on a CPU-only machine reads it: no GPU talk for a CPU recipe, whole figures in an
80-column terminal, and a hint that runs the recipe the way it was given."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.estimate.views import Estimate, RunProjection
from tunekit.search.view import print_estimate

cli = CliRunner()


def test_a_cpu_recipe_gets_no_gpu_memory_lines(tmp_path):
    res = cli.invoke(app, ["estimate", "--runs", str(tmp_path), "--set", "system.device=cpu"])
    text = " ".join(res.output.split())
    assert "no GPU memory to estimate" in text and "--gpu-profile" in text
    assert "GPU 0" not in text and "NCCL" not in text and "per GPU" not in text


def test_the_hint_runs_a_recipe_given_as_a_file(tmp_path):
    recipe = tmp_path / "my-qa.yaml"
    recipe.write_text("name: my-qa\nsystem:\n  device: cpu\n")
    res = cli.invoke(app, ["estimate", "--recipe", str(recipe), "--runs", str(tmp_path), "--set", "probe.seed=3"])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    hint = text[text.index("error:"):].split("`")[1]
    argv = shlex.split(hint)
    assert argv[:4] == ["tunekit", "probe", "--recipe", str(recipe)] and argv[4:] == ["--set", "probe.seed=3"]
    assert load_recipe(argv[3], [argv[5]]).probe.seed == 3  # the hint's recipe loads, wherever it lives


def test_the_projection_keeps_its_yuan_whole_at_80_columns():
    run = RunProjection(Path("runs/20260101-000000-my-qa"), "a100-80g", 100, 12000, 0.48461, 12.4, 8, 1234.5678 * 3600,
                        9876.54, 123456.7, "a100-80g")
    console = Console(width=80, record=True)
    print_estimate(console, Estimate("my-qa", "12000 steps (given)", [run, run], 0))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    rows = [line for line in text.splitlines() if line.strip().startswith(("1 ", "median"))]
    assert len(rows) == 2 and all(line.rstrip().endswith("1.235e+05") for line in rows), text
    assert all("…" not in line for line in rows), text
    assert "GPU-h" in text
    cpu = RunProjection(Path("runs/20260101-000000-my-qa"), "cpu", 100, 12000, 0.48461, 12.4, 1, 3600.0, 1.0, 0.1, "cpu",
                        on_gpu=False)
    console = Console(width=80, record=True)
    print_estimate(console, Estimate("my-qa", "12000 steps (given)", [cpu], 0))
    assert "CPU-h" in console.export_text() and "GPU-h" not in console.export_text()  # a CPU run holds no GPU


def test_a_sampled_response_length_is_said_and_charged_and_bad_counts_are_refused(tmp_path, monkeypatch):
    """``--sample-responses`` asks the embedded model for its answers' length, says what it found and where, and the
    estimate's assumptions charge it; a count outside the first step's prompts, or no GPU type to estimate on, is
    one sentence and exit 2 before anything is printed."""
    monkeypatch.chdir(tmp_path)
    res = cli.invoke(app, ["estimate", "--gpu-profile", "h200", "--sample-responses", "8"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    said = text[text.index("sampled 8 responses of the initial policy on "):]
    tokens = said.split(": ")[1].split(" tokens")[0]
    assert 0 < float(tokens) < load_recipe().task.max_new_tokens
    assert f"responses of {tokens} tokens on average, as 8 responses of the initial policy" in text
    for args, words in ((["--gpu-profile", "h200", "--sample-responses", "0"], "--sample-responses 0: give a number"),
                        (["--sample-responses", "4"], "--sample-responses: the sampled length feeds the cost model")):
        res = cli.invoke(app, ["estimate", *args])
        assert res.exit_code == 2 and " ".join(res.output.split()).startswith(f"error: {words}")


def test_with_nothing_to_reprice_it_says_what_to_run_and_a_run_until_the_threshold_names_target_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ here, and none given
    res = cli.invoke(app, ["estimate", "--set", "system.device=cpu"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and text.startswith("error: no runs/ here to reprice: run `tunekit probe` first")
    assert "--gpu-profile NAME" in text and not any(tmp_path.iterdir())
    until = ["estimate", "--gpu-profile", "h200", "--set", "run.until=threshold"]
    text = " ".join(cli.invoke(app, until).output.split())
    assert "full run: unknown (until the threshold" in text and "--target-steps N prices N steps" in text
    text = " ".join(cli.invoke(app, [*until, "--target-steps", "500"]).output.split())
    assert "full run: 500 steps (given by --target-steps), start-up" in text


def test_probes_reprice_with_a_users_own_profile_file(tmp_path):
    """A profile given by its file (not shipped, its name unknown to tunekit) prices the probes' runs and says what
    an hour is an hour of."""
    import yaml

    from report_synth import write_run
    from tunekit.estimate.profiles import PROFILES_DIR
    from tunekit.estimate.views import estimate

    card = yaml.safe_load((PROFILES_DIR / "h200.yaml").read_text()) | {"name": "my-h200", "yuan_per_gpu_hour": 10.0}
    (tmp_path / "my-h200.yaml").write_text(yaml.safe_dump(card))
    write_run(tmp_path / "runs", "r1")
    est = estimate(load_recipe(None), runs_dir=tmp_path / "runs", gpu_profile=str(tmp_path / "my-h200.yaml"),
                   target_steps=100)
    console = Console(width=120, record=True)
    print_estimate(console, est)
    text = console.export_text()
    assert "my-h200" in text and "GPU-h" in text and est.runs[0].on_gpu
    assert est.runs[0].yuan == pytest.approx(est.runs[0].wall_s / 3600 * 10.0 * est.runs[0].gpus_held)


def test_repricing_gpu_probes_on_a_cpu_machine_is_not_refused_for_want_of_a_gpu(tmp_path, monkeypatch):
    """The refusals read where the estimate prices: probes made on GPUs, repriced here, are GPU runs; a CPU
    profile prices a CPU run, which verl cannot make."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    verl = ["--recipe", "tiny-grpo", "--runner", "verl", "--set", "system.controller=single",
            "--set", "system.rollout.backend=vllm"]
    res = CliRunner().invoke(app, ["estimate", *verl, "--runs", "runs"])
    assert res.exit_code == 2 and "no finished probe of recipe 'tiny-grpo'" in res.output, res.output
    res = CliRunner().invoke(app, ["estimate", *verl, "--gpu-profile", "cpu"])
    assert res.exit_code == 2 and "runner verl trains on NVIDIA GPUs only" in res.output


def test_probes_of_another_configuration_are_named_by_the_keys_that_differ(tmp_path):
    """A probe run with a --set the estimate was not given is not this configuration; the refusal names the keys
    it differs in, so the user gives the same --set, rather than saying no probe exists."""
    from report_synth import write_run

    write_run(tmp_path / "runs", "r1", overrides=("system.batch.micro_batch_size=2", "algorithm.actor_lr=0.002"))
    res = cli.invoke(app, ["estimate", "--runs", str(tmp_path / "runs")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "no finished probe of recipe 'default'" in text
    assert ("its probes there ran another configuration: they differ in algorithm.actor_lr, "
            "system.batch.micro_batch_size; give the same --set") in text
    res = cli.invoke(app, ["estimate", "--runs", str(tmp_path / "runs"), "--set", "system.batch.micro_batch_size=2",
                           "--set", "algorithm.actor_lr=0.002", "--target-steps", "50"])
    assert res.exit_code == 0, res.output
