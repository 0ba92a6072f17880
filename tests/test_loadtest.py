"""``tunekit loadtest`` against a local completions server with injected latency (tests/completions_server.py):
its figures, its pass line and exit codes, and what it says and keeps when the server fails."""

from __future__ import annotations

import importlib
import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from completions_server import Behaviour, completions_server
from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.loadtest import bench
from tunekit.loadtest.client import Endpoint, Sampling, run_level
from tunekit.loadtest.results import level_row

FAST = ["--set", "loadtest.rounds=3", "--set", "loadtest.warmup_requests=2"]
# a pass line any working client clears: tests whose subject is not the pass line should not fail on a busy machine
# (one in CI once reached 35 QPS at 8 in flight against a server that allows 100)
EASY_PASS = ["--min-qps", "1"]


def _run(url: str, out: Path, *args: str, env: dict | None = None):
    result = CliRunner().invoke(app, ["loadtest", "--url", url, "--concurrency", "1,8", "--at-concurrency", "8",
                                      "--out", str(out), *FAST, *args], env=env)
    record = json.loads((out / "loadtest.json").read_text()) if (out / "loadtest.json").exists() else None
    return result, record


def _rows(record: dict) -> dict[int, dict]:
    return {r["concurrency"]: r for r in record["rows"]}


def test_figures_follow_the_injected_latency_unstreamed(tmp_path):
    # 150 ms injected: long beside the client's and server's own CPU time per request, which a 2-core machine busy
    # with other tests stretches to tens of milliseconds (at 60 ms, 8 in flight once reached only 1.8x one)
    with completions_server(Behaviour(latency_s=0.15, tokens=4)) as url:
        result, record = _run(url, tmp_path / "lt", "--set", "loadtest.stream=false", "--min-qps", "10")
    assert result.exit_code == 0, result.output
    one, eight = _rows(record)[1], _rows(record)[8]
    assert one["requests"] == 20 and eight["requests"] == 24 and not one["failed"] and not eight["failed"]
    assert 150 <= one["latency_ms_p50"] <= 240  # 150 ms injected, plus a busy 2-core machine's own overhead
    assert one["latency_ms_p50"] <= one["latency_ms_p95"] <= one["latency_ms_p99"]
    assert 1000 / 240 <= one["qps"] <= 1000 / 150  # one at a time: at most one per 150 ms
    assert 150 <= eight["latency_ms_p50"]
    # 8 in flight: never more than 8 per 150 ms, and at least twice the single-request rate (the server sleeps, so
    # requests overlap; a client that sent them one by one would stay near it). A busy machine stalls a few
    # requests for hundreds of milliseconds, so the bound leaves room below the 8x an idle one reaches.
    assert 2 * one["qps"] <= eight["qps"] <= 1.02 * 8 * 1000 / 150
    assert eight["tokens_per_s"] == pytest.approx(4 * eight["qps"])  # 4 completion tokens each (usage)
    assert one["ttft_ms_p50"] is None  # nothing streamed
    assert one["pass"] is True and eight["pass"] is True and record["pass"] is True and record["complete"]
    assert "pass" in result.output and "concurrency 8" in result.output


def test_streamed_requests_give_the_time_to_first_token(tmp_path):
    behaviour = Behaviour(latency_s=0.05, token_gap_s=0.01, tokens=4)
    with completions_server(behaviour) as url:
        result, record = _run(f"{url}/v1/", tmp_path / "lt", "--max-tokens", "4", *EASY_PASS)  # the OpenAI client's base URL
    assert record["target"]["url"] == url and record["target"]["model"] == "fake-model"
    assert behaviour.models_asked == 1  # the check before the test asks; the test reuses its answer
    assert result.exit_code == 0, result.output
    one = _rows(record)[1]
    assert 50 <= one["ttft_ms_p50"] <= 120  # first token after 50 ms
    assert 80 <= one["latency_ms_p50"] <= 170  # then 3 more, 10 ms apart
    assert one["latency_ms_p50"] - one["ttft_ms_p50"] >= 30
    assert one["tokens_per_s"] == pytest.approx(4 * one["qps"])
    assert record["sampling"]["max_tokens"] == 4 and record["sampling"]["ignore_eos"] is True


def test_a_missed_pass_line_exits_1_and_says_which(tmp_path):
    with completions_server(Behaviour(latency_s=0.03)) as url:
        result, record = _run(url, tmp_path / "lt", "--min-qps", "100000", "--max-latency-ms", "1")
    assert result.exit_code == 1
    assert record["pass"] is False and _rows(record)[8]["pass"] is False and _rows(record)[1]["pass"] is False
    assert record["verdict"].startswith("fail:") and "QPS at concurrency 8" in record["verdict"]


def test_the_api_key_is_sent_but_never_shown_or_written(tmp_path):
    secret = "sk-test-7f3a9c"
    behaviour = Behaviour(latency_s=0.01, api_key=secret)
    with completions_server(behaviour) as url:
        result, record = _run(url, tmp_path / "lt", "--set", "loadtest.api_key_env=LT_TEST_KEY",
                              *EASY_PASS, env={"LT_TEST_KEY": secret})
        refused, _ = _run(url, tmp_path / "no-key", "--set", "loadtest.api_key_env=LT_TEST_KEY_UNSET")
    assert result.exit_code == 0, result.output
    assert f"Bearer {secret}" in behaviour.seen_keys
    assert secret not in result.output and secret not in (tmp_path / "lt" / "loadtest.json").read_text()
    assert refused.exit_code == 2 and "HTTP 401" in refused.output and "api_key_env" in refused.output


def test_an_unreachable_url_is_one_sentence_exit_2_and_nothing_written(tmp_path):
    with completions_server(Behaviour()) as url:
        pass  # stopped: nothing listens there any more
    result, record = _run(url, tmp_path / "lt" / "a" / "b")  # folders the test would have made, nested
    assert result.exit_code == 2
    assert "does not answer" in result.output or "no answer" in result.output
    assert "--url" in result.output and url in result.output
    assert len([ln for ln in result.output.splitlines() if ln.strip()]) <= 3  # one sentence, wrapped
    assert record is None and not (tmp_path / "lt").exists()


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "1,x"], "loadtest.concurrency"),
    (["--concurrency", "0"], "loadtest.concurrency"),
    (["--min-qps", "-1"], "loadtest.min_qps"),
    (["--set", "loadtest.client=grpc"], "loadtest.client"),
])
def test_bad_arguments_exit_2_naming_the_key(tmp_path, args, needle):
    result = CliRunner().invoke(app, ["loadtest", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "lt"), *args])
    assert result.exit_code == 2 and needle in result.output
    assert not (tmp_path / "lt").exists()


def test_a_url_that_is_not_http_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["loadtest", "--url", "ftp://host:21", "--out", str(tmp_path / "lt")])
    assert result.exit_code == 2 and "loadtest.url" in result.output and "http://" in result.output


def test_server_errors_mid_test_keep_the_measured_rows_and_mark_the_stop(tmp_path):
    # level 1 takes 2 warm-up + 20 measured requests; every later request gets HTTP 500
    with completions_server(Behaviour(latency_s=0.01, ok_requests=22)) as url:
        result, record = _run(url, tmp_path / "lt", "--concurrency", "1,8,32")
    assert result.exit_code == 1
    rows = _rows(record)
    assert rows[1]["failed"] == 0 and rows[1]["qps"] is not None
    # its warm-up failed whole, so the level stops there rather than send 24 more to fail
    assert rows[8]["failed"] == rows[8]["requests"] and rows[8]["qps"] is None and rows[8]["pass"] is False
    assert "HTTP 500" in rows[8]["error"] and f"{rows[8]['requests']} of {rows[8]['requests']} requests failed" in rows[8]["error"]
    assert 32 not in rows and record["complete"] is False and record["pass"] is False
    assert record["stopped"].startswith("every request at concurrency 8 failed")
    assert record["verdict"].startswith("incomplete:") and "HTTP 500" in result.output


def test_malformed_answers_are_failed_requests_saying_so(tmp_path):
    with completions_server(Behaviour(latency_s=0.005, mode="malformed")) as url:
        result, record = _run(url, tmp_path / "lt", "--set", "loadtest.stream=false")
    assert result.exit_code == 1
    row = record["rows"][0]
    assert row["failed"] == row["requests"] and "not JSON" in row["error"] and record["stopped"] is not None


def test_a_request_past_the_timeout_fails_with_the_key_named():
    sampling = Sampling(max_tokens=4, temperature=1.0, ignore_eos=True, stream=True)
    with completions_server(Behaviour(mode="slow", slow_s=1.0)) as url:
        outcomes, duration = run_level(Endpoint(url, "fake-model"), sampling, ["p"], concurrency=4, requests=4,
                                       warmup=0, timeout_s=0.2)
    assert duration < 0.9  # the client gave up at its timeout, not when the server answered
    row = level_row(4, outcomes, duration)
    assert row["failed"] == 4 and "no complete answer within 0.2 s (loadtest.timeout_s)" in row["error"]


def test_a_server_that_answers_nothing_fails_its_level_at_the_warm_up():
    """Against a server that takes every request but answers none, each request waits out its timeout: a level
    whose warm-up failed whole is not measured, or it would wait (warm-up + measured) x the timeout."""
    sampling = Sampling(max_tokens=4, temperature=1.0, ignore_eos=True, stream=True)
    with completions_server(Behaviour(mode="slow", slow_s=5.0)) as url:
        start = time.perf_counter()
        outcomes, duration = run_level(Endpoint(url, "fake-model"), sampling, ["p"], concurrency=1, requests=20,
                                       warmup=2, timeout_s=0.2)
        took = time.perf_counter() - start
    assert len(outcomes) == 2 and all(o.error.startswith("every warm-up request failed") for o in outcomes)
    assert duration == 0.0
    assert took < 2.0  # two timeouts, not twenty-two
    assert level_row(1, outcomes, duration)["qps"] is None


def test_no_thread_of_the_test_is_left_running():
    before = {t.ident for t in threading.enumerate()}
    with completions_server(Behaviour(latency_s=0.005)) as url:
        run_level(Endpoint(url, "fake-model"), Sampling(4, 1.0, True, False), ["p"], concurrency=2, requests=2,
                  warmup=0, timeout_s=5)
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before


def test_the_recipes_own_server_needs_vllm_here(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: tunekit would start the server")
    result = CliRunner().invoke(app, ["loadtest", "--out", str(tmp_path / "lt")])
    assert result.exit_code == 2 and "vLLM is not installed" in result.output and "--url" in result.output
    assert not (tmp_path / "lt").exists()


def test_levels_always_hold_the_pass_lines_rows():
    c = load_recipe(None, ["loadtest.concurrency=[8, 4]", "loadtest.at_concurrency=16"]).loadtest
    assert c.levels == [1, 4, 8, 16]
    assert c.requests_at(1) == 20 and c.requests_at(16) == 64  # at least min_requests, else concurrency x rounds


# ------------------------------------------------------------------ vLLM's own client


def test_bench_command_sends_the_same_work():
    sampling = Sampling(max_tokens=64, temperature=0.7, ignore_eos=True, stream=True)
    cmd = bench.bench_command(Endpoint("http://h:1", "m", "secret"), sampling, dataset=Path("/d/p.jsonl"),
                              tokenizer="/tok", concurrency=32, requests=128, warmup=8, result=Path("/o/r.json"),
                              seed=3, timeout_s=60)
    args = dict(zip(cmd, cmd[1:]))
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert args["--max-concurrency"] == "32" and args["--num-prompts"] == "128" and args["--num-warmups"] == "8"
    assert args["--custom-output-len"] == "64" and args["--temperature"] == "0.7" and "--ignore-eos" in cmd
    assert args["--dataset-path"] == "/d/p.jsonl" and args["--result-filename"] == "r.json"
    assert args["--metric-percentiles"] == "50,95,99" and "secret" not in " ".join(cmd)


def test_bench_result_becomes_a_row():
    # the keys vllm bench serve writes with --percentile-metrics ttft,e2el --metric-percentiles 50,95,99
    result = {"completed": 126, "failed": 2, "duration": 3.0, "request_throughput": 42.0, "output_throughput": 2688.0,
              "p50_e2el_ms": 700.0, "p95_e2el_ms": 900.0, "p99_e2el_ms": 950.0, "median_ttft_ms": 30.0,
              "p50_ttft_ms": 30.0, "p95_ttft_ms": 50.0, "p99_ttft_ms": 60.0}
    row = bench.bench_row(64, result)
    assert (row["requests"], row["failed"], row["qps"], row["tokens_per_s"]) == (128, 2, 42.0, 2688.0)
    assert (row["latency_ms_p50"], row["latency_ms_p95"], row["latency_ms_p99"], row["ttft_ms_p50"]) == (700, 900, 950, 30)
    assert row["error"] == "2 of 128 requests failed (vllm bench serve)"


def test_a_bench_run_that_fails_is_a_row_of_failed_requests(tmp_path):
    if bench.available():
        pytest.skip("vLLM is installed: its client would run")
    sampling = Sampling(max_tokens=4, temperature=1.0, ignore_eos=True, stream=True)
    dataset = bench.write_dataset(tmp_path / "p.jsonl", ["a", "b"])
    row = bench.run_bench_level(Endpoint("http://127.0.0.1:9", "m"), sampling, dataset=dataset, tokenizer="/tok",
                                concurrency=2, requests=20, warmup=0, out_dir=tmp_path, seed=0, timeout_s=5)
    assert row["failed"] == row["requests"] == 20 and row["qps"] is None
    assert "vllm bench serve exited with code 1" in row["error"] and "No module named" in row["error"]


# ------------------------------------------------------------------ the report's section


def _loadtest_of(url: str, out: Path, seqs: int) -> None:
    from tunekit.loadtest import run_loadtest

    recipe = load_recipe(None, ["system.rollout.backend=vllm_server", f"system.rollout.server_url={url}",
                                f"system.rollout.max_num_seqs={seqs}", "loadtest.concurrency=[1,2]",
                                "loadtest.at_concurrency=2", "loadtest.rounds=1", "loadtest.warmup_requests=0"])
    run_loadtest(recipe, out_dir=out)


def test_the_report_shows_the_curves_beside_probes_of_the_same_rollout(tmp_path):
    from report_synth import write_run
    from tunekit.report import build_report
    from tunekit.report.load import load_records
    from tunekit.report.loadtest import agreement, pairs

    runs = tmp_path / "runs"
    write_run(runs, "probe-seqs16", overrides=("system.rollout.max_num_seqs=16",), extra={"steady": {"timing_s/gen": 2.0}})
    write_run(runs, "probe-seqs128", overrides=("system.rollout.max_num_seqs=128",), seed=1,
              extra={"steady": {"timing_s/gen": 1.0}})
    with completions_server(Behaviour(latency_s=0.03)) as slow, completions_server(Behaviour(latency_s=0.005)) as fast:
        _loadtest_of(slow, runs / "lt-seqs16", 16)
        _loadtest_of(fast, runs / "lt-seqs128", 128)
    records = load_records([runs])
    assert len(records.probes) == 2 and len(records.loadtests) == 2  # a load test is not a probe
    table = pairs(records.loadtests, records.probes).set_index("label")
    assert table.loc["lt-seqs16", "probes"] == ["probe-seqs16"] and table.loc["lt-seqs16", "gen_s"] == 2.0
    assert table.loc["lt-seqs128", "probes"] == ["probe-seqs128"]
    assert table.loc["lt-seqs128", "qps"] > table.loc["lt-seqs16", "qps"]
    said = agreement(table.reset_index())
    assert said.startswith("Ranking by load-test QPS agrees") and "1 of 1 pairs" in said
    html = build_report([runs], tmp_path / "r.html").read_text()
    assert 'id="loadtest"' in html and "lt-seqs128" in html and "probe-seqs16" in html


def test_a_ranking_that_disagrees_says_so():
    import pandas as pd

    from tunekit.report.loadtest import agreement

    table = pd.DataFrame({"label": ["a", "b", "c"], "qps": [50.0, 40.0, 30.0], "gen_s": [2.0, 1.0, 3.0],
                          "probes": [["p1"], ["p2"], ["p3"]]})
    said = agreement(table)  # a before b by QPS, b before a by generation time; the other two pairs agree
    assert said.startswith("Ranking by load-test QPS disagrees") and "2 of 3 pairs" in said
    assert agreement(table.head(1)) is None


# ------------------------------------------------------------------ a search's screening signal


def _screen_recipe(tmp_path: Path, url: str | None) -> Path:
    import yaml

    data = {"name": "screened", "system": {"batch": {"prompts_per_step": 4, "micro_batch_size": 4}},
            "probe": {"steps": 4, "warmup_steps": 1, "timeout_s": 120}, "profiler": {"comm_steps": 0},
            "loadtest": {"concurrency": [1, 2], "at_concurrency": 2, "rounds": 1, "warmup_requests": 0},
            "search": {"reward_threshold": 0.0, "reward_window": 2, "confirm_top": 0, "loadtest_screen": True,
                       "space": [{"key": "system.rollout.max_num_seqs", "type": "categorical", "choices": [16, 128]}]}}
    data["system"]["rollout"] = {"max_num_seqs": 16} | ({"server_url": url} if url else {})
    path = tmp_path / "screened.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_screened_search_without_a_server_to_load_is_refused(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: the search could start the engines")
    result = CliRunner().invoke(app, ["search", "--recipe", str(_screen_recipe(tmp_path, None)), "--budget-yuan", "5",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "search.loadtest_screen is on" in result.output and "vLLM" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_screened_search_records_each_rollout_configurations_qps(tmp_path):
    from tunekit.report import build_report
    from tunekit.search import run_search

    out = tmp_path / "out"
    with completions_server(Behaviour(latency_s=0.005)) as url:
        path = _screen_recipe(tmp_path, url)
        result = run_search(load_recipe(str(path)), budget_yuan=5, trials=2, out_dir=out, recipe_ref=str(path))
    probed = [r for r in result.trials if r["duplicate_of"] is None]
    assert len(probed) == 2 and all(r["loadtest_qps"] and r["loadtest_error"] is None for r in probed)
    dirs = sorted((out / "loadtests").iterdir())
    assert len(dirs) == 2 and all((d / "loadtest.json").exists() for d in dirs)  # one per max_num_seqs
    html = build_report([out], tmp_path / "r.html").read_text()
    assert 'id="loadtest"' in html and "Ranking by load-test QPS" in html


def test_the_recipes_own_server_is_served_with_its_engine_knobs_and_takes_text(tmp_path):
    from tunekit.loadtest.target import server_for
    from tunekit.workload.models import EMBEDDED_MODEL_DIR

    recipe = load_recipe(None, ["system.rollout.max_num_seqs=16", "system.rollout.gpu_memory_utilization=0.3",
                                "system.rollout.enable_prefix_caching=false", "system.device_map.rollout=[1]"])
    server = server_for(recipe, EMBEDDED_MODEL_DIR, tmp_path, max_tokens=64)
    cmd = server.command
    args = dict(zip(cmd, cmd[1:]))
    assert cmd[cmd.index("-m") + 1:cmd.index("-m") + 3] == ["vllm.entrypoints.cli.main", "serve"]
    assert args["--max-num-seqs"] == "16" and args["--gpu-memory-utilization"] == "0.3"
    assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
    assert "--skip-tokenizer-init" not in cmd  # a load test sends text, as a user's client does
    assert server.env["CUDA_VISIBLE_DEVICES"] == "1" and server.log_path == tmp_path / "vllm_server.log"
    assert server.proc is None  # built, not started


@pytest.mark.parametrize("defined,flag", [('"--custom-skip-chat-template"', "--custom-skip-chat-template"),
                                          ('"--skip-chat-template"', "--skip-chat-template")])
def test_the_template_flag_is_the_one_the_installed_client_defines(tmp_path, monkeypatch, defined, flag):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vLLM is installed")
    pkg = tmp_path / "site" / "vllm" / "benchmarks" / "datasets"
    pkg.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    (pkg / "arg_utils.py").write_text(f"parser.add_argument({defined}, action='store_true')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert bench.skip_template_flag() == flag


def test_prompts_go_through_the_recipes_chat_template(tmp_path):
    from tunekit.workload.models import EMBEDDED_MODEL_DIR, load_tokenizer

    tok = load_tokenizer(str(EMBEDDED_MODEL_DIR))
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    tok.save_pretrained(tmp_path / "tok")
    behaviour = Behaviour(latency_s=0.002)
    with completions_server(behaviour) as url:
        result, _ = _run(url, tmp_path / "lt", "--set", f"model.tokenizer_path={tmp_path / 'tok'}",
                         "--concurrency", "1", "--at-concurrency", "1", *EASY_PASS)
        one, _ = _run(url, tmp_path / "one", "--set", f"model.tokenizer_path={tmp_path / 'tok'}", "--prompt", "hello",
                      "--concurrency", "1", "--at-concurrency", "1", *EASY_PASS)
    assert result.exit_code == 0 and one.exit_code == 0, result.output + one.output
    workload, given = behaviour.prompts[:22], behaviour.prompts[22:]
    assert all(p.startswith("<user>") and p.endswith("</user><assistant>") and "=" in p for p in workload)
    assert len(set(workload)) > 1  # the workload's prompts, in turn
    assert set(given) == {"<user>hello</user><assistant>"}


# ------------------------------------------------------------------ on a GPU: the recipe's own vllm serve


@pytest.mark.gpu
def test_gpu_the_recipes_own_server_is_loaded_and_stopped(tmp_path):
    """The embedded model served by the vllm serve tunekit starts (text prompts, its engine knobs), loaded by
    tunekit's client, then stopped with its process group: no process of it is left."""
    import psutil

    from conftest import vllm_gpu_skip
    from tunekit.loadtest import run_loadtest

    if (reason := vllm_gpu_skip()):
        pytest.skip(reason)
    recipe = load_recipe(None, ["system.rollout.gpu_memory_utilization=0.2", "system.rollout.max_num_seqs=8",
                                "loadtest.concurrency=[1,8]", "loadtest.at_concurrency=8", "loadtest.client=http",
                                "loadtest.max_tokens=16", "loadtest.rounds=2", "loadtest.min_qps=1"])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    test = run_loadtest(recipe, out_dir=tmp_path / "lt")
    rows = {r["concurrency"]: r for r in test.rows}
    assert test.complete and not rows[1]["failed"] and not rows[8]["failed"], test.record()
    assert rows[1]["tokens_per_s"] == pytest.approx(16 * rows[1]["qps"], rel=1e-6)  # ignore_eos: 16 tokens each
    assert rows[1]["ttft_ms_p50"] is not None and rows[8]["qps"] > rows[1]["qps"]
    assert test.target["started_by_tunekit"] and test.target["rollout"]["max_num_seqs"] == 8
    assert (tmp_path / "lt" / "vllm_server.log").exists() and not (tmp_path / "lt" / "vllm_server.pgid").exists()
    assert {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()} <= before


def test_an_error_reported_mid_stream_is_a_failed_request_saying_so():
    sampling = Sampling(max_tokens=4, temperature=1.0, ignore_eos=True, stream=True)
    with completions_server(Behaviour(latency_s=0.002, mode="stream_error")) as url:
        outcomes, duration = run_level(Endpoint(url, "fake-model"), sampling, ["p"], concurrency=2, requests=2,
                                       warmup=0, timeout_s=5)
    row = level_row(2, outcomes, duration)
    assert row["failed"] == 2 and "error mid-stream" in row["error"] and "engine died" in row["error"]


def test_an_unreachable_url_is_the_first_and_only_thing_said(tmp_path):
    """Checked before the recipe's model is prepared or its prompts rendered (no note of theirs comes first)."""
    result = CliRunner().invoke(app, ["loadtest", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "lt")])
    assert result.exit_code == 2 and result.output.startswith("error: loadtest.url (--url) http://127.0.0.1:9")
    assert not (tmp_path / "lt").exists()
