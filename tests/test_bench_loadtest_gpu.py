"""benchmarks/loadtest_gpu.py on CPU: against a running server (the recipe's ``system.rollout.server_url``) it runs
tunekit's sweep and vLLM's client on the same server and files both; vLLM's client, absent here, is an entry that
says why, and tunekit's rows stand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from completions_server import Behaviour, completions_server
from tunekit.loadtest import bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_both_clients_run_on_one_server_and_are_filed(tmp_path, monkeypatch):
    import loadtest_gpu

    if bench.available():
        pytest.skip("vLLM is installed: its client would run for real")
    with completions_server(Behaviour(latency_s=0.005)) as url:
        monkeypatch.setattr(sys, "argv", [
            "loadtest_gpu.py", str(tmp_path), "--config", "fake", "none", f"system.rollout.server_url={url}",
            "loadtest.concurrency=[1,2]", "loadtest.at_concurrency=2", "loadtest.rounds=1", "loadtest.warmup_requests=0"])
        loadtest_gpu.main()
    (entry,) = json.loads((tmp_path / "loadtest_gpu.json").read_text())["configs"]
    assert [r["concurrency"] for r in entry["http"]["rows"]] == [1, 2] and entry["http"]["pass"] is not None
    assert "needs vllm and datasets installed" in entry["vllm_bench"]["error"]
    assert "tunekit_over_vllm" not in entry  # no ratio without both sweeps


def test_ratios_are_tunekits_figure_over_vllms_at_each_level_both_measured():
    from loadtest_gpu import _ratios

    ours = [{"concurrency": 1, "qps": 10.0, "tokens_per_s": 640.0, "latency_ms_p50": 100.0, "latency_ms_p95": 120.0,
             "ttft_ms_p50": 5.0}, {"concurrency": 8, "qps": 50.0}]
    theirs = [{"concurrency": 1, "qps": 8.0, "tokens_per_s": 512.0, "latency_ms_p50": 125.0, "latency_ms_p95": 150.0,
               "ttft_ms_p50": None}]
    assert _ratios(ours, theirs) == [{"concurrency": 1, "qps": 1.25, "tokens_per_s": 1.25, "latency_ms_p50": 0.8,
                                      "latency_ms_p95": 0.8, "ttft_ms_p50": None}]
