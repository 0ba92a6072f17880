"""TRL probes end to end on CPU: learning on the embedded pair, a user's dataset and reward under both runners,
a search whose answer is a TRL launch, and refusals before anything is written."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
from typer.testing import CliRunner

from tunekit import metrics, rundir
from tunekit.cli import app

pytest.importorskip("trl")
cli = CliRunner()
RECORDS = ("step", "reward/mean", "timing_s/gen", "timing_s/reward", "timing_s/old_logprob", "timing_s/update_actor",
           "timing_s/update_weights", "timing_s/step", "response_length/mean", "perf/total_tokens")


def only_run(out):
    (run,) = rundir.find_run_dirs(out)  # not the compile cache beside it
    return run, json.loads((run / "summary.json").read_text()), pd.read_parquet(run / "steps.parquet")


@pytest.mark.slow  # 100 TRL steps: about 80-110 s on 2 busy CPU cores
def test_trl_probe_learns_the_embedded_pair(tmp_path):
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--steps", "100", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    run, summary, steps = only_run(tmp_path)
    assert summary["status"] == "ok" and summary["runner"] == "trl" and summary["steps"] == 100
    assert summary["reward_last10"] - summary["reward_first10"] >= 0.1, (summary["reward_first10"], summary["reward_last10"])
    for col in RECORDS:
        assert col in steps.columns and steps[col].notna().all(), col
    assert list(steps["step"]) == list(range(100))
    assert (steps["timing_s/step"] >= steps["timing_s/gen"] + steps["timing_s/update_actor"]).all()
    assert summary["cost/projected_yuan"] > summary["cost/probe_yuan"] > 0 and summary["perf/throughput"] > 0
    assert not (run / "trl").exists()  # TRL's output_dir: nothing of it stays in the run directory


@pytest.fixture
def user_workload(tmp_path, monkeypatch):
    """A few hundred JSONL rows and a reward module in a temporary working directory; the reward logs each score."""
    rng = random.Random(0)
    rows = [{"q": f"{a}+{b}", "sum": a + b} for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(300))]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sum_reward.py").write_text(
        "from pathlib import Path\n"
        "def first_digit(prompt, response, answer):\n"
        "    value = 0.75 if response.strip()[:1] == answer[:1] else 0.25\n"
        "    with (Path(__file__).parent / 'scores.txt').open('a') as f:\n"
        "        f.write(f'{prompt}|{value}\\n')\n"
        "    return {'score': value, 'right': float(value > 0.5)}\n")
    monkeypatch.chdir(tmp_path)
    return ["--set", "task.dataset=sums.jsonl", "--set", "task.prompt_column=q", "--set", "task.answer_column=sum",
            "--set", "task.prompt_template={q}=", "--set", "task.reward=sum_reward:first_digit"]


@pytest.mark.slow  # probes of 7-9 s each on 2 CPU cores
@pytest.mark.parametrize("runner", ["builtin", "trl"])
def test_both_runners_train_on_the_users_dataset_and_reward(tmp_path, user_workload, runner):
    steps_n, batch = 4, 16 * 4
    res = cli.invoke(app, ["probe", "--runner", runner, "--recipe", "tiny-grpo", "--steps", str(steps_n),
                           "--out", str(tmp_path / "runs"), *user_workload])
    assert res.exit_code == 0, res.output
    run, summary, steps = only_run(tmp_path / "runs")
    assert summary["status"] == "ok" and len(steps) == steps_n and summary["runner"] == runner
    assert metrics.unknown(steps.columns) == [] and metrics.unknown(metrics.summary_metrics(summary)) == []
    scores = [line.rsplit("|", 1) for line in (tmp_path / "scores.txt").read_text().splitlines()]
    trained = scores[-steps_n * batch:]  # before them: the preflight's dry calls, in the launcher
    assert all(p.endswith("=") and "+" in p for p, _ in trained)  # the template over the file's rows
    # each step's recorded reward is the mean of what the user's function returned for that step's samples
    for i, recorded in enumerate(steps["reward/mean"]):
        mine = [float(v) for _, v in trained[i * batch:(i + 1) * batch]]
        assert recorded == pytest.approx(sum(mine) / batch)
        # the dict's other key, as verl's reward_extra_info: the step's mean
        assert steps["reward/extra/right"][i] == pytest.approx(sum(v > 0.5 for v in mine) / batch)
    # samples.parquet: a few of each step's responses, each with the prompt and the reward the user's function gave
    samples = rundir.read_samples(run)
    assert sorted(set(samples["step"])) == list(range(steps_n)) and (samples.groupby("step").size() == 4).all()
    for row in samples.itertuples():
        assert (row.prompt, f"{row.reward:g}") in {(p, f"{float(v):g}") for p, v in trained[row.step * batch:(row.step + 1) * batch]}
        assert row.answer == str(sum(int(x) for x in row.prompt.rstrip("=").split("+")))


def test_trl_refuses_what_it_cannot_express_before_writing(tmp_path):
    out = tmp_path / "runs"
    res = cli.invoke(app, ["probe", "--runner", "trl", "--steps", "2", "--out", str(out)])  # the default is PPO
    assert res.exit_code == 2 and "algorithm.name=ppo" in " ".join(res.output.split())
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--out", str(out),
                           "--set", "system.controller=single"])
    assert res.exit_code == 2 and "system.controller=single" in " ".join(res.output.split())
    assert not out.exists()


@pytest.mark.slow  # two 40-step TRL probes
def test_trl_search_writes_the_winner_as_a_trl_launch(tmp_path):
    out = tmp_path / "search"
    # one trial, no confirmation round: the baseline is the winner, written as TRL's own launch
    res = cli.invoke(app, ["search", "--runner", "trl", "--recipe", "tiny-trl", "--budget-yuan", "1", "--trials", "1",
                           "--set", "search.confirm_top=0", "--out", str(out)])
    assert res.exit_code in (0, 1), res.output
    result = json.loads((out / "search.json").read_text())
    assert [t["status"] for t in result["trials"]][:1] == ["ok"]
    assert result["best"] is not None, result["notes"]  # tiny-trl's threshold is below where 40 TRL steps end
    launch = (out / "trl_launch.py").read_text()
    assert "GRPOConfig(" in launch and "GRPOTrainer(" in launch and "trl_launch.py" in res.output
    compile(launch, "trl_launch.py", "exec")


@pytest.mark.slow  # probes of 7-9 s each on 2 CPU cores
@pytest.mark.parametrize("fault, status", [("oom", "oom"), ("crash", "failed")])
def test_a_failing_trl_rank_is_a_recorded_status(tmp_path, monkeypatch, fault, status):
    monkeypatch.setenv("TUNEKIT_FAULT", fault)
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--steps", "3", "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output
    (run,) = list(tmp_path.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == status and summary["steps"] == 1  # step 0 recorded, the fault at step 1


@pytest.mark.slow  # probes of 7-9 s each on 2 CPU cores
def test_trl_evaluates_greedily_on_the_held_out_prompts(tmp_path, monkeypatch):
    from tunekit.config import load_recipe
    from tunekit.workload import build_workload

    sets = ["probe.eval_every=2", "task.eval_fraction=0.05", "task.reward=marks:reward"]
    held = {p.text for p in build_workload(load_recipe("tiny-grpo", sets[:2]).task).eval_prompts(64)}
    # a reward that says whether it scored a held-out prompt: a training step's reward/extra never holds one
    (tmp_path / "held.json").write_text(json.dumps(sorted(held)))
    (tmp_path / "marks.py").write_text(
        "import json\nfrom pathlib import Path\nfrom tunekit.workload.arithmetic import reward as arith\n"
        "HELD = set(json.loads((Path(__file__).parent / 'held.json').read_text()))\n"
        "def reward(prompt, response, answer):\n"
        "    return {'score': arith(prompt, response, answer), 'held': float(prompt in HELD)}\n")
    monkeypatch.chdir(tmp_path)
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--steps", "3", "--out", str(tmp_path / "o"),
                           *(a for k in sets for a in ("--set", k))])
    assert res.exit_code == 0, res.output
    run, summary, steps = only_run(tmp_path / "o")
    assert steps["reward/extra/held"].tolist() == [0.0, 0.0, 0.0]  # the evaluation's rewards are no step's
    # the held-out reward after the second step, as eval/reward_mean beside its time; the training rows stay TRL's;
    # no evaluation after the third (transformers' at the end of training), which no probe step asked for
    assert steps["eval/reward_mean"].notna().tolist() == [False, True, False] and steps["eval/time_s"].iloc[1] > 0
    assert summary["eval/evaluations"] == 1 and (run / "log.txt").read_text().count("'eval_runtime'") == 2
    assert 0 <= steps["eval/reward_mean"].iloc[1] <= 1 and metrics.unknown(steps.columns) == []
    # greedy answers to the held-out sums beat the sampled training answers of the embedded warm model
    assert steps["eval/reward_mean"].iloc[1] > steps["reward/mean"].mean()
    samples = rundir.read_samples(run)  # the evaluation's responses are no training step's samples
    assert (samples.groupby("step").size() == 4).all()
    # TRL's evaluate() before its first step too, inside the start-up; each evaluation's every answer kept
    assert 0 < summary["startup/eval_before_s"] < summary["startup_s"] and 0 <= summary["eval/reward_before"] <= 1
    # the rest of the start-up in its parts: the checkpoint prepared by this rank's own process, TRL's imports, the
    # workload, the trainer built; together within the launch to the first step
    parts = [summary[f"startup/{name}_s"] for name in ("prepare", "imports", "setup", "framework_init", "eval_before")]
    assert min(parts) > 0 and summary["startup/launch_s"] + sum(parts) <= summary["startup_s"] + 1e-6
    answers = rundir.read_samples(run, rundir.EVAL_SAMPLES)  # each held-out prompt once an evaluation
    assert answers.groupby("trained_steps")["prompt"].apply(sorted).to_dict() == {0: sorted(held), 2: sorted(held)}
    means = answers.groupby("trained_steps")["reward"].mean()
    assert means[0] == pytest.approx(summary["eval/reward_before"]) and means[2] == pytest.approx(steps["eval/reward_mean"].iloc[1])


@pytest.mark.slow  # a probe of about 10 s on 2 CPU cores
def test_trls_held_out_reward_is_the_mean_over_the_prompts_whatever_the_micro_batch(tmp_path, user_workload):
    """A reward that ignores the response (1 for a sum divisible by 3): the held-out reward is that share of the
    held-out prompts exactly, not a mean of batch means that weighs a short last batch's prompts more."""
    from tunekit.config import load_recipe
    from tunekit.workload import build_workload

    (tmp_path / "third.py").write_text("def third(prompt, response, answer):\n    return float(int(answer) % 3 == 0)\n")
    sets = [*user_workload[:-2], "--set", "task.reward=third:third", "--set", "probe.eval_every=2",
            "--set", "task.eval_fraction=0.2", "--set", "probe.eval_prompts=14", "--set", "system.batch.micro_batch_size=8"]
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--steps", "2", "--out", str(tmp_path / "o"), *sets])
    assert res.exit_code == 0, res.output
    _, _, steps = only_run(tmp_path / "o")
    task = load_recipe("tiny-grpo", [a for a in sets if a != "--set"]).task
    held = build_workload(task).eval_prompts(14)
    assert len(held) == 14 and steps["eval/reward_mean"].iloc[1] == pytest.approx(sum(int(p.answer) % 3 == 0 for p in held) / 14)


@pytest.mark.gpu
def test_gpu_a_one_gpu_trl_probe_with_a_colocated_engine_trains_in_its_first_process(tmp_path):
    from conftest import vllm_gpu_skip

    reason = vllm_gpu_skip()
    if reason:
        pytest.skip(reason)
    res = cli.invoke(app, ["probe", "--runner", "trl", "--recipe", "tiny-grpo", "--steps", "2", "--out", str(tmp_path),
                           "--set", "system.device=cuda", "--set", "system.rollout.backend=vllm",
                           "--set", "system.rollout.gpu_memory_utilization=0.2",
                           "--set", "system.rollout.enforce_eager=false", "--set", "system.rollout.torch_compile=true"])
    assert res.exit_code == 0, res.output
    run, summary, steps = only_run(tmp_path)
    assert summary["status"] == "ok" and list(steps["step"]) == [0, 1]
    assert steps["reward/mean"].notna().all() and (steps["timing_s/gen"] > 0).all()
    # the rank recorded preparing the checkpoint itself: it is the probe's first process, not a torchrun child
    assert summary["startup/prepare_s"] > 0 and summary["startup/launch_s"] < summary["startup_s"]
