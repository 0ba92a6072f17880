"""A search's handed-back command runs as printed, from any directory: the recipe's files found by absolute path,
the user's reward module importable, and the run's length settable."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunekit.config import load_raw
from tunekit.estimate.profiles import load_profile
from tunekit.search.result import handback

REWARD = '''
import json
from pathlib import Path


def compute_score(*, data_source, solution_str, ground_truth, extra_info=None):
    """verl's spelling, keyword-only, a dict return: each call is logged beside the module."""
    with (Path(__file__).parent / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"types": [type(v).__name__ for v in (data_source, solution_str, ground_truth)],
                            "data_source": data_source, "level": extra_info.get("level"),
                            "index": extra_info.get("index")}) + "\\n")
    return {"score": float(solution_str.strip() == ground_truth), "exact": 1.0}
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's project: a JSONL file and a reward module, given to tunekit by relative paths from this directory."""
    user = tmp_path / "project"
    user.mkdir()
    rows = [{"q": f"{i % 10}+1=", "a": i % 10 + 1, "data_source": f"src{i % 3}", "level": i % 2} for i in range(12)]
    (user / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (user / "handback_reward.py").write_text(REWARD)
    monkeypatch.chdir(user)
    yield user
    sys.modules.pop("handback_reward", None)


def answer(base_sets: list[str], out: Path) -> tuple[str, dict[str, str]]:
    raw, _ = load_raw("tiny-grpo")
    best = {"sets": base_sets, "projected_yuan": None}
    hb = handback(raw, best, 5, out, load_profile("cpu"))
    out.mkdir(parents=True, exist_ok=True)
    for name, text in hb.files.items():
        (out / name).write_text(text)
    return hb.command, hb.files


USER_SETS = ["task.dataset=rows.jsonl", "task.prompt_column=q", "task.answer_column=a",
             "task.reward=handback_reward:compute_score", "system.device=cpu"]


def test_the_builtin_answer_names_absolute_files_and_the_reward_directory(user_dir, tmp_path):
    command, files = answer(USER_SETS, tmp_path / "search")
    argv = shlex.split(command)
    assert argv[:3] == ["cd", str((tmp_path / "search").resolve()), "&&"]
    assert f"PYTHONPATH={user_dir.resolve()}:$PYTHONPATH" in command
    (recipe_file,) = files
    saved = yaml.safe_load(files[recipe_file])
    assert saved["task"]["dataset"] == str(user_dir.resolve() / "rows.jsonl")
    assert saved["probe"]["save_policy"] is True  # the full run leaves its trained policy
    assert "--steps 5" in command and "--gpu-profile" not in command  # the run detects its profile as the search did
    # a search given a profile prices the full run with it: the shipped name as given, a file by its absolute path
    raw, _ = load_raw("tiny-grpo")
    named = handback(raw, {"sets": USER_SETS, "projected_yuan": None}, 5, tmp_path / "s2", load_profile("h200"), "h200")
    assert named.command.endswith("--steps 5 --gpu-profile h200")
    (user_dir / "mine.yaml").write_text("x")
    own = handback(raw, {"sets": USER_SETS, "projected_yuan": None}, 5, tmp_path / "s3", load_profile("cpu"), "mine.yaml")
    assert own.command.endswith(f"--gpu-profile {user_dir.resolve() / 'mine.yaml'}")


@pytest.mark.slow  # a two-step TRL run on CPU: about 15-30 s on 2 busy cores
def test_the_trl_answer_runs_as_printed_for_two_steps(user_dir, tmp_path):
    pytest.importorskip("trl")
    sets = [*USER_SETS, "runner=trl", "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2",
            "system.batch.micro_batch_size=8", "system.batch.mini_batch_size=8"]
    out = tmp_path / "search"
    command, files = answer(sets, out)
    assert set(files) == {"trl_launch.py"} and command.endswith("python trl_launch.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tunekit_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=tunekit_root, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(["bash", "-c", command + " --steps 2"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in (user_dir / "calls.jsonl").read_text().splitlines()]
    trained = calls  # two steps of 4 prompts x 2 samples: the script itself checks nothing before training
    assert len(calls) == 2 * 4 * 2 and all(c["types"] == ["str", "str", "str"] for c in calls)
    assert {c["data_source"] for c in trained} <= {"src0", "src1", "src2"}
    rows = [json.loads(line) for line in (user_dir / "rows.jsonl").read_text().splitlines()]
    # the row's own columns reach extra_info, with its index in the file
    assert all(c["level"] == rows[c["index"]]["level"] and c["data_source"] == rows[c["index"]]["data_source"] for c in trained)
    assert (out / "trl-out").is_dir()  # TRL wrote its output where the command said it runs


@pytest.mark.slow  # runs the printed command up to verl's training: about 10 s on 2 cores
def test_the_verl_answer_writes_its_data_as_printed(user_dir, tmp_path):
    """verl's command up to the training (which needs verl and GPUs): the data step, run from another directory,
    reads the user's file and reward module and writes the length STEPS says."""
    out = tmp_path / "search"
    command, _ = answer([*USER_SETS, "runner=verl", "system.device=cuda", "system.batch.prompts_per_step=4",
                         "system.batch.micro_batch_size=4", "system.batch.mini_batch_size=4"], out)
    assert f"export PYTHONPATH={user_dir.resolve()}:$PYTHONPATH" in command and "STEPS=5 && " in command
    until_training = command[:command.index(" && CUDA_VISIBLE_DEVICES=")].replace("STEPS=5", "STEPS=3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(["bash", "-c", until_training], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import pandas as pd

    train = pd.read_parquet(out / "verl-data" / "train.parquet")
    assert len(train) == 3 * 4  # STEPS=3 steps of 4 prompts
    assert set(train["data_source"]) <= {"src0", "src1", "src2"}
    assert all(info["level"] in (0, 1) for info in train["extra_info"])
