"""The user's workload: a dataset file and a reward function, checked before the first probe."""

from __future__ import annotations

import json
import re
import random
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import TaskConfig
from tunekit.config.errors import ConfigError
from tunekit.workload import Prompt, build_workload, check_workload

cli = CliRunner()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A module ``user_rewards`` on a temporary path, with good and bad reward functions."""
    (tmp_path / "user_rewards.py").write_text(
        "def starts_right(prompt, response, answer):\n"
        "    return 1.0 if response.strip()[:1] == answer[:1] else 0.0\n"
        "def verl_style(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'source': data_source}\n"
        "def raises(prompt, response, answer):\n"
        "    raise KeyError('needs a judge')\n"
        "def text(prompt, response, answer):\n"
        "    return 'good'\n"
        "LIMIT = 3\n")
    (tmp_path / "needs_more.py").write_text("import no_such_dependency_xyz\n")  # found, failing as it imports
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_rewards"
    sys.modules.pop("user_rewards", None)


def test_dataset_rows_template_and_seeded_sampling(tmp_path, reward_module):
    rows = [{"q": f"{i}+1=", "a": i + 1, "level": "easy"} for i in range(30)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    task = TaskConfig(dataset=str(data), prompt_column="q", answer_column="a", prompt_template="{level}:{q}",
                      reward=f"{reward_module}:starts_right")
    w = build_workload(task)
    got = w.sample(10, random.Random(5))
    assert got == w.sample(10, random.Random(5)) and len(set(got)) == 10  # seeded, distinct within a step
    assert all(p.text.startswith("easy:") and int(p.answer) == int(p.text[5:-3]) + 1 for p in got)
    assert len(w.sample(50, random.Random(0))) == 50  # more than the file has: drawn with replacement
    assert w.score(Prompt("x", "12"), " 19") == 1.0 and w.score(Prompt("x", "12"), "29") == 0.0


def test_parquet_and_verl_style_reward(tmp_path, reward_module):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}).to_parquet(path)
    w = build_workload(TaskConfig(dataset=str(path), reward=f"{reward_module}:verl_style"))
    assert w.score(Prompt("1+1=", "2"), "2") == 1.0 and w.score(Prompt("1+1=", "2"), "3") == 0.0
    check_workload(TaskConfig(dataset=str(path), reward=f"{reward_module}:verl_style"))


def bad_cases(tmp_path, mod):
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 5)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    (tmp_path / "d.csv").write_text("prompt,answer\n1+1=,2\n")
    return [
        (["task.dataset=" + str(tmp_path / "missing.jsonl")], "task.dataset .*does not exist or is not a file;"),
        (["task.dataset=data/missing.jsonl"], "a relative path is read from the directory tunekit runs in"),
        (["task.dataset=" + str(tmp_path / "empty.jsonl")], "task.dataset .*(no rows|not valid)"),
        (["task.dataset=" + str(tmp_path / "broken.jsonl")], "task.dataset .*not valid JSONL"),
        (["task.dataset=" + str(tmp_path / "d.csv")], "task.dataset .*neither .jsonl nor .parquet"),
        (["task.dataset=" + str(good), "task.prompt_column=question"], "no column 'question'.*set task.prompt_column"),
        (["task.dataset=" + str(good), "task.answer_column=solution"], "no column 'solution'.*set task.answer_column"),
        (["task.dataset=" + str(good), "task.prompt_template=Q {question}"], "task.prompt_template .*KeyError"),
        (["task.reward=no_such_module_xyz:score"], "task.reward .*cannot be imported.*put its directory on PYTHONPATH"),
        (["task.reward=needs_more:score"], "no_such_dependency_xyz.*it was found, and failed while importing"),
        ([f"task.reward={mod}:LIMIT"], "task.reward .*has 'LIMIT', a int, not a function"),
        (["task.reward=score_without_module"], "task.reward .*not module:function"),
        ([f"task.reward={mod}:missing"], "task.reward .*no function 'missing'"),
        ([f"task.reward={mod}:raises"], "task.reward .*KeyError.*needs a judge"),
        ([f"task.reward={mod}:text"], "task.reward .*str 'good'.*not a number"),
    ]


def test_bad_workloads_stop_the_probe_before_anything_is_written(tmp_path, reward_module):
    out = tmp_path / "runs"
    for sets, pattern in bad_cases(tmp_path, reward_module):
        res = cli.invoke(app, ["probe", "--steps", "1", "--out", str(out), *[a for s in sets for a in ("--set", s)]])
        assert res.exit_code == 2, (sets, res.output)
        msg = " ".join(res.output.split())
        assert "error:" in msg and re.search(pattern, msg), (pattern, msg)
        assert not out.exists()


def test_check_workload_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="task.dataset"):
        check_workload(TaskConfig(dataset=str(tmp_path / "nope.parquet")))
