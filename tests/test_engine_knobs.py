"""vLLM engine knobs: one mapping from ``system.rollout`` to the in-process engine's arguments and the server's
flags, and the values vLLM would refuse, refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.config.errors import ConfigError
from tunekit.trainer.rollout.engine_io import engine_flags, engine_knobs
from tunekit.trainer.rollout.vllm_server import server_command


def _rollout(*sets: str):
    return load_recipe(None, list(sets)).system.rollout


def test_unset_knobs_leave_vllm_its_defaults():
    rc = _rollout("system.rollout.backend=vllm")
    assert engine_knobs(rc) == {}
    assert engine_flags(engine_knobs(rc)) == []


def test_set_knobs_reach_the_engine_under_vllm_names():
    rc = _rollout("system.rollout.max_num_seqs=64", "system.rollout.max_num_batched_tokens=4096",
                  "system.rollout.enable_prefix_caching=false", "system.rollout.enable_chunked_prefill=true")
    assert engine_knobs(rc) == {"max_num_seqs": 64, "max_num_batched_tokens": 4096,
                                "enable_prefix_caching": False, "enable_chunked_prefill": True}


def test_server_flags_spell_vllm_serve_options():
    assert engine_flags({"max_num_seqs": 8, "enable_prefix_caching": True, "enable_chunked_prefill": False}) == [
        "--max-num-seqs", "8", "--enable-prefix-caching", "--no-enable-chunked-prefill"]


def test_server_command_carries_the_knobs():
    r = load_recipe(None, ["system.rollout.backend=vllm_server", "system.rollout.max_num_batched_tokens=2048",
                           "system.rollout.enable_prefix_caching=true"])
    cmd = server_command(Path("/ckpt"), port=1, recipe=r, max_len=640, sleep=False)
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"
    assert "--enable-prefix-caching" in cmd and "--max-num-seqs" not in cmd


@pytest.mark.parametrize("sets, words", [
    (["system.rollout.max_num_seqs=0"], "system.rollout.max_num_seqs"),
    (["system.rollout.max_num_batched_tokens=-5"], "system.rollout.max_num_batched_tokens"),
    (["system.rollout.max_num_seqs=256", "system.rollout.max_num_batched_tokens=128"],
     "max_num_batched_tokens 128 is below max_num_seqs 256"),
    # 512 prompt tokens + 4 new tokens = 516 must fit in one step when prefills are not chunked
    (["system.rollout.max_num_batched_tokens=515", "system.rollout.enable_chunked_prefill=false"],
     "max_num_batched_tokens 515 is below the longest sequence 516"),
])
def test_values_vllm_refuses_are_refused_up_front(sets, words):
    with pytest.raises(ConfigError) as e:
        load_recipe(None, sets)
    assert words in e.value.message and e.value.exit_code == 2


def test_longest_sequence_fits_or_chunked_prefill_splits_it():
    assert engine_knobs(_rollout("system.rollout.max_num_batched_tokens=516",
                                 "system.rollout.enable_chunked_prefill=false"))["max_num_batched_tokens"] == 516
    assert engine_knobs(_rollout("system.rollout.max_num_batched_tokens=100"))["max_num_batched_tokens"] == 100


def test_cli_refuses_with_exit_code_2():
    res = CliRunner().invoke(app, ["estimate", "--set", "system.rollout.max_num_seqs=-1"])
    assert res.exit_code == 2 and "max_num_seqs" in res.output
