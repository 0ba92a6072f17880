"""The shipped arithmetic Q&A task: its dataset is written once into the cache, the same rows every time, and its
reward scores the final number."""

from __future__ import annotations

import json
import re

import pytest

from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError
from tunekit.workload import build_workload
from tunekit.workload.arith_qa import final_number, reward
from tunekit.workload.cache import CACHE_ENV, writing
from tunekit.workload.shipped import dataset_file


@pytest.mark.parametrize(("response", "answer", "score"), [
    ("19", "19", 1.0), ("12 + 7 = 19", "19", 1.0), ("The answer is 19.", "19", 1.0), ("1,019", "1019", 1.0),
    ("12 + 7 = 18", "19", 0.0), ("19 ... or maybe 20", "19", 0.0), ("", "0", 0.0), ("nineteen", "19", 0.0),
    ("50 - 8 = -42", "42", 0.0)])
def test_the_reward_is_one_for_the_right_final_number(response, answer, score):
    assert reward("What is 12 + 7? Reply with only the number.", response, answer) == score


def test_final_number():
    assert final_number("13 + 14 = 25") == 25 and final_number("-3") == -3 and final_number("none") is None


def test_the_dataset_is_written_once_and_the_same_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a"))
    first = dataset_file("tunekit:arith-qa")
    assert first.startswith(str(tmp_path / "a" / "datasets"))
    stamp = (tmp_path / "a" / "datasets").stat().st_mtime_ns, len(list((tmp_path / "a" / "datasets").iterdir()))
    assert dataset_file("tunekit:arith-qa") == first  # reused
    assert ((tmp_path / "a" / "datasets").stat().st_mtime_ns, 1) == stamp
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "b"))
    assert open(dataset_file("tunekit:arith-qa"), "rb").read() == open(first, "rb").read()
    rows = [json.loads(line) for line in open(first)]
    assert len(rows) == 51 * 51 + 51 * 52 // 2 and len({r["prompt"] for r in rows}) == len(rows)
    for r in rows:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\? Reply with only the number\.", r["prompt"]).groups()
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
    assert dataset_file("data/train.jsonl") == "data/train.jsonl"  # a user's file is left as given


def test_an_unknown_shipped_dataset_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=r"task.dataset 'tunekit:nope' is not a dataset tunekit ships; choose one of: tunekit:arith-qa"):
        dataset_file("tunekit:nope")


def test_a_write_that_fails_leaves_nothing(tmp_path):
    final = tmp_path / "datasets" / "x.jsonl"
    with pytest.raises(KeyboardInterrupt), writing(final) as tmp:
        tmp.write_text('{"prompt": "half')
        raise KeyboardInterrupt
    assert list((tmp_path / "datasets").iterdir()) == []


def test_the_recipes_workload_reads_the_dataset_and_scores_with_the_reward(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    w = build_workload(load_recipe("smollm2-arith").task)
    (p,) = w.sample(1, __import__("random").Random(0))
    assert p.text.startswith("What is ") and p.data_source == "arith-qa"
    assert w.score(p, f"The answer is {p.answer}") == 1.0 and w.score(p, "I don't know") == 0.0
