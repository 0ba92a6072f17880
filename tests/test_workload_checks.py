"""The user's workload checked before the first probe: prompts the tokenizer cannot represent, and a reward tried on
right, wrong, empty and long responses over rows of every data source; then the same reward failing mid-probe."""

from __future__ import annotations

import json
import re
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import TaskConfig
from tunekit.workload.models import load_tokenizer
from tunekit.workload import Prompt, build_workload, check_workload
from tunekit.workload.checks import REWARD_ROWS, check_prompts, lost_share, reward_rows

cli = CliRunner()

REWARDS = '''
import math


def wrong_raises(prompt, response, answer):
    if response.strip() != answer:
        raise ValueError("cannot parse " + response[:10])
    return 1.0


def empty_none(prompt, response, answer):
    return None if not response else float(response.strip() == answer)


def wrong_nan(prompt, response, answer):
    return 1.0 if response.strip() == answer else math.nan


def right_inf(data_source, solution_str, ground_truth, extra_info=None):
    return math.inf if solution_str == ground_truth else 0.0


def minus_one(prompt, response, answer):
    return 1.0 if response.strip() == answer else -1.0


def long_raises(prompt, response, answer):
    if len(response) > 1000:
        raise RecursionError("too long")
    return float(response.strip() == answer)


def dict_without_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": 1.0}


def dict_nan_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float("nan"), "acc": 1.0}


def only_source_c_raises(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "c":
        raise KeyError("no judge for c")
    return float(solution_str == ground_truth)


def verl_kwonly(*, data_source, solution_str, ground_truth, extra_info):
    assert all(isinstance(v, str) for v in (data_source, solution_str, ground_truth))
    return {"score": float(solution_str.strip() == ground_truth), "source_is_" + data_source: 1.0,
            "level": float(extra_info["level"]), "note": "kept out of the metrics"}


def tunekit_kwonly(*, prompt, response, answer):
    return float(response.strip() == answer)


def fine_minus_one(prompt, response, answer):
    return 1.0 if response.strip() == answer else -1.0
'''


@pytest.fixture
def rewards(tmp_path, monkeypatch):
    (tmp_path / "check_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "check_rewards"
    sys.modules.pop("check_rewards", None)


def rows_file(tmp_path, name="rows.jsonl", n=40, sources=("a", "a", "a", "b"), rare=None):
    rows = [{"prompt": f"{i % 9}+{i % 7}=", "answer": str(i % 9 + i % 7), "data_source": sources[i % len(sources)],
             "level": i % 3} for i in range(n)]
    if rare is not None:
        rows[n // 2]["data_source"] = rare
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def probe(tmp_path, *sets):
    out = tmp_path / "runs"
    res = cli.invoke(app, ["probe", "--steps", "1", "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    return res, " ".join(res.output.split()), out


@pytest.mark.parametrize("fn, what", [
    ("wrong_raises", r"raised ValueError: cannot parse"),
    ("empty_none", r"returned None, not a number .* with the response ''"),
    ("wrong_nan", r"returned nan, not a finite number"),
    ("right_inf", r"returned inf, not a finite number"),
    ("minus_one", r"returned -1, outside task.reward_range \[0, 1\].*set task.reward_range"),
    ("long_raises", r"raised RecursionError: too long .*characters\)"),
    ("dict_without_score", r"a dict without a 'score' key"),
    ("dict_nan_score", r"'score' is nan"),
    ("only_source_c_raises", r"raised KeyError"),
])
def test_a_reward_that_fails_any_trial_response_stops_the_probe(tmp_path, rewards, fn, what):
    data = rows_file(tmp_path, rare="c")  # one row of 40 comes from source c
    res, msg, out = probe(tmp_path, f"task.dataset={data}", f"task.reward={rewards}:{fn}")
    assert res.exit_code == 2, msg
    assert msg.startswith(f"error: task.reward '{rewards}:{fn}'"), msg
    assert re.search(what, msg), msg
    assert re.search(r"on row \d+ \('", msg) and f"task.dataset '{data}'" in msg and "with the response" in msg, msg
    assert not out.exists()


def test_a_reward_range_that_covers_the_reward_lets_it_through(tmp_path, rewards):
    data = rows_file(tmp_path)
    check_workload(TaskConfig(dataset=str(data), reward=f"{rewards}:fine_minus_one", reward_range=(-1.0, 1.0)))
    with pytest.raises(Exception, match="outside task.reward_range"):
        check_workload(TaskConfig(dataset=str(data), reward=f"{rewards}:fine_minus_one"))


def test_the_reward_rows_cover_every_data_source():
    prompts = [Prompt(f"{i}", "1", data_source="big", row=i) for i in range(500)]
    prompts += [Prompt("r1", "1", data_source="rare1", row=500), Prompt("r2", "1", data_source="rare2", row=501)]
    picked = reward_rows(prompts)
    assert len(picked) >= REWARD_ROWS and len(set(picked)) == len(picked)
    assert {p.data_source for p in picked} == {"big", "rare1", "rare2"}
    few = prompts[:5]
    assert reward_rows(few) == few  # a small file: every row


def test_verls_contract_the_rows_source_other_columns_and_dict_extras(tmp_path, rewards):
    data = rows_file(tmp_path, sources=("gsm8k", "math"))
    task = TaskConfig(dataset=str(data), reward=f"{rewards}:verl_kwonly")
    check_workload(task)
    w = build_workload(task)
    p = w.prompts.examples()[5]
    assert p.data_source == "math" and p.row == 5
    assert dict(p.extra_info) == {"index": 5, "split": "train", "level": 5 % 3}  # prompt and answer are arguments
    scored = w.reward(p, p.answer)
    assert scored.value == 1.0 and scored.extra == {"source_is_math": 1.0, "level": 2.0}
    assert w.score(p, "nope") == 0.0
    # no data_source column: the file's name; a nested extra_info column merges into extra_info
    plain = tmp_path / "plain.parquet"
    pd.DataFrame({"prompt": ["1+1="], "answer": ["2"], "extra_info": [{"level": 7, "index": 40}]}).to_parquet(plain)
    (q,) = build_workload(TaskConfig(dataset=str(plain), reward=f"{rewards}:verl_kwonly")).prompts.examples()
    assert q.data_source == "plain" and q.extra_info == {"index": 40, "split": "train", "level": 7}
    kw = build_workload(TaskConfig(dataset=str(plain), reward=f"{rewards}:tunekit_kwonly"))
    assert kw.score(q, " 2") == 1.0


def test_prompts_the_tokenizer_cannot_represent_stop_the_probe(tmp_path):
    words = tmp_path / "words.parquet"
    pd.DataFrame({"prompt": ["3+4=", "What is three plus four?"], "answer": ["7", "7"]}).to_parquet(words)
    res, msg, out = probe(tmp_path, f"task.dataset={words}")
    assert res.exit_code == 2 and not out.exists(), msg
    assert f"task.dataset '{words}': row 1 ('What is three plus four?')" in msg, msg
    assert "the embedded character tokenizer" in msg and "model.path or model.preset" in msg, msg
    letters = tmp_path / "letters.jsonl"
    letters.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "abc", "answer": "x"}\n')
    res, msg, out = probe(tmp_path, f"task.dataset={letters}")
    assert res.exit_code == 2 and "row 1 ('abc') encodes to no tokens" in msg, msg
    empty = tmp_path / "empty_prompt.jsonl"
    empty.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "", "answer": "x"}\n')
    res, msg, out = probe(tmp_path, f"task.dataset={empty}")
    assert res.exit_code == 2 and "row 1 ('') encodes to no tokens" in msg, msg


def test_the_prompt_check_allows_a_small_loss_and_normalised_text():
    tok = load_tokenizer(None)
    assert lost_share("12+7=", "12+7=") == 0.0 and lost_share("ABC", "abc") == 0.0
    assert lost_share("12 + 7 =", "12+7=") == 0.0  # whitespace a tokenizer drops is not a loss
    assert lost_share("1234567890" * 3 + "x", "1234567890" * 3) == pytest.approx(1 / 31)
    check_prompts([Prompt("1234567890" * 3 + "x", "1")], tok, tokenizer_name="t", source="s")  # 3% lost: fine
    with pytest.raises(Exception, match=r"s: row 2 \('12x'\) loses 33% of its characters through t"):
        check_prompts([Prompt("12x", "1", row=2)], tok, tokenizer_name="t", source="s")


RUNTIME = '''
import math
import os


def fails_in_the_probe(prompt, response, answer):
    if os.environ.get("TUNEKIT_RUN_DIR"):
        return math.nan if os.environ.get("CHECK_REWARD_NAN") else 1 / 0
    return float(response.strip() == answer)
'''


# Each runner's ranks score through one UserReward, whose two failures (raised, no finite number) the preflight cases
# above check one by one: a probe of each runner meets one of them mid-probe, together both.
@pytest.mark.parametrize("runner, nan, said", [
    pytest.param("builtin", False, "raised ZeroDivisionError: division by zero", marks=pytest.mark.slow),  # a probe
    pytest.param("trl", True, "returned nan, not a finite number", marks=pytest.mark.slow),  # another probe: ~20 s
])
def test_a_reward_failing_mid_probe_ends_it_as_failed_with_the_sentence(tmp_path, monkeypatch, runner, nan, said):
    from tunekit.rundir import RUN_DIR_ENV

    assert RUN_DIR_ENV == "TUNEKIT_RUN_DIR"
    (tmp_path / "runtime_reward.py").write_text(RUNTIME)
    monkeypatch.chdir(tmp_path)
    if nan:
        monkeypatch.setenv("CHECK_REWARD_NAN", "1")
    try:
        res, msg, out = probe(tmp_path, "task.reward=runtime_reward:fails_in_the_probe", f"runner={runner}",
                              "algorithm.name=grpo", "system.batch.samples_per_prompt=2")
    finally:
        sys.modules.pop("runtime_reward", None)
    (run,) = out.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed", summary
    assert summary["reason"].startswith("task.reward 'runtime_reward:fails_in_the_probe' " + said), summary["reason"]
    assert "with the response" in summary["reason"] and "Traceback" not in summary["reason"]


def test_a_verl_parquet_reads_through_keys_inside_its_columns(tmp_path, rewards):
    """verl's own RL parquet: the prompt as chat messages, the answer inside reward_model, facts in extra_info."""
    path = tmp_path / "gsm8k_train.parquet"
    pd.DataFrame({
        "data_source": ["openai/gsm8k"] * 3,
        "prompt": [[{"role": "user", "content": f"What is {i}+1?"}] for i in range(3)],
        "ability": ["math"] * 3,
        "reward_model": [{"ground_truth": str(i + 1), "style": "rule"} for i in range(3)],
        "extra_info": [{"split": "train", "index": i, "question": f"{i}+1=", "level": i} for i in range(3)],
    }).to_parquet(path)
    res, msg, out = probe(tmp_path, f"task.dataset={path}", "task.answer_column=reward_model.ground_truth")
    assert res.exit_code == 2 and not out.exists(), msg
    assert "row 0's task.prompt_column 'prompt' holds a" in msg and "extra_info.question" in msg, msg
    task = TaskConfig(dataset=str(path), prompt_column="extra_info.question", answer_column="reward_model.ground_truth",
                      reward=f"{rewards}:verl_kwonly")
    check_workload(task)
    (p, *_) = build_workload(task).prompts.examples()
    assert (p.text, p.answer, p.data_source) == ("0+1=", "1", "openai/gsm8k")
    assert p.extra_info["level"] == 0 and p.extra_info["index"] == 0 and p.extra_info["split"] == "train"
    res, msg, _ = probe(tmp_path, f"task.dataset={path}", "task.answer_column=reward_model.answer")
    assert res.exit_code == 2 and "no column 'reward_model.answer'" in msg and "column.key" in msg, msg


def test_a_broken_jsonl_line_is_named_by_its_number(tmp_path):
    from tunekit.config.errors import ConfigError
    from tunekit.workload.dataset import read_table

    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3=", answer: 6}\n')
    with pytest.raises(ConfigError, match=r"rows.jsonl' is not valid JSONL \(line 4: Expecting property name"):
        read_table(str(path))
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n["3+3=", "6"]\n')
    with pytest.raises(ConfigError, match=r"line 2: a JSON list, not an object of columns"):
        read_table(str(path))
