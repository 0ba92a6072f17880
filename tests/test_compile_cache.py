"""The compile cache a search's probes share: a directory that cannot be used leaves a probe cold (never failed),
probes writing it at once leave whole entries, and a probe says whether its compiles were answered from it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tunekit.config import load_recipe
from tunekit.runners import runner_for
from tunekit.runners.base import (CACHE_STATE_ENV, COMPILE_THREADS_ENV, COMPILED_MARK_ENV, compile_cache_env,
                                  mark_compiled, probe_env)
from tunekit.rundir import COMPILE_CACHE


def _env(runs: Path) -> dict[str, str]:
    recipe = load_recipe(None, ["system.compile=true"])
    return runner_for(recipe).env(recipe, runs / "P00", on_gpu=False)


def test_a_shared_cache_holds_inductors_and_vllms(tmp_path) -> None:
    env = _env(tmp_path / "runs")
    cache = (tmp_path / "runs").resolve() / COMPILE_CACHE
    assert env[CACHE_STATE_ENV] == "shared" and env["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert env["VLLM_CACHE_ROOT"] == str(cache / "vllm")
    assert list(cache.iterdir()) == []  # the write check leaves nothing behind


def test_a_cache_path_taken_by_a_file_leaves_the_probe_cold_with_its_reason(tmp_path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / COMPILE_CACHE).write_text("not a directory")
    env = _env(runs)
    assert env[CACHE_STATE_ENV].startswith("cold: ") and "not writable" in env[CACHE_STATE_ENV]
    private = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert private.is_dir() and private != runs / COMPILE_CACHE
    (private / "entry").write_text("x")  # the probe can compile into it


def test_a_generated_module_that_does_not_parse_is_removed_and_the_cache_stays_shared(tmp_path) -> None:
    """Inductor never rewrites a module that exists, so a corrupt one would fail every later probe's load of its
    graph: it is taken out (the graph's entry writes it again) and the probe says so."""
    cache = tmp_path / COMPILE_CACHE
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "cgood.py").write_text("def call(args):\n    return args\n")
    assert compile_cache_env(cache, {})[CACHE_STATE_ENV] == "shared"
    (cache / "ab" / "cbad.py").write_text("def call(args:\n")  # cut short
    env = compile_cache_env(cache, {})
    assert env[CACHE_STATE_ENV].startswith("shared; removed") and "cbad.py" in env[CACHE_STATE_ENV]
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache) and not (cache / "ab" / "cbad.py").exists()
    assert (cache / "ab" / "cgood.py").exists() and compile_cache_env(cache, {})[CACHE_STATE_ENV] == "shared"
    # a graph's module as Inductor writes it (torch 2.13: its call bound from a Runner), then one cut short that parses
    graph = ("from torch._inductor.async_compile import AsyncCompile\nasync_compile = AsyncCompile()\n"
             "class Runner:\n    def call(self, args):\n        return args\n\nrunner = Runner()\ncall = runner.call\n")
    (cache / "cd").mkdir()
    (cache / "cd" / "cwhole.py").write_text(graph)
    (cache / "cd" / "ccut.py").write_text("\n".join(graph.splitlines()[:2]) + "\n")
    env = compile_cache_env(cache, {})
    assert "ccut.py" in env[CACHE_STATE_ENV] and not (cache / "cd" / "ccut.py").exists()
    assert (cache / "cd" / "cwhole.py").exists() and compile_cache_env(cache, {})[CACHE_STATE_ENV] == "shared"


@pytest.mark.parametrize("fault, words", [("full", "No space left on device"), ("read-only", "Read-only file system"),
                                          ("nearly full", "MiB free, under the 2 GiB")])
def test_a_cache_that_cannot_take_a_compile_leaves_the_probe_cold_in_a_private_directory_removed_after(
        tmp_path, monkeypatch, fault, words) -> None:
    import errno
    import os
    import shutil
    from collections import namedtuple

    from tunekit.runners import base

    if fault == "nearly full":
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 1024**3, 10 * 1024**3 - 300 * 1024**2, 300 * 1024**2))
    else:
        code = errno.ENOSPC if fault == "full" else errno.EROFS

        def fsync(fd):
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(os, "fsync", fsync)
    cache = tmp_path / COMPILE_CACHE
    env = compile_cache_env(cache, {})
    assert env[CACHE_STATE_ENV].startswith("cold: ") and words in env[CACHE_STATE_ENV], env[CACHE_STATE_ENV]
    private = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert private.is_dir() and private != cache and env["VLLM_CACHE_ROOT"] == str(private / "vllm")
    (private / "entry").write_text("x")  # the probe compiles into it; the launcher removes it when the probe ends
    base.remove_private_cache(env)
    assert not private.exists() and cache.is_dir()
    base.remove_private_cache({CACHE_STATE_ENV: "shared", "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert cache.is_dir()  # the shared one is never removed


def test_a_probe_whose_shapes_an_earlier_one_compiled_starts_with_one_compile_thread(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(COMPILE_THREADS_ENV, raising=False)
    runs = tmp_path / "runs"
    first = _env(runs)
    assert COMPILE_THREADS_ENV not in first  # nothing compiled yet: Inductor's worker pool compiles the graphs
    mark_compiled(first | {CACHE_STATE_ENV: "cold: a private directory"})
    assert not Path(first[COMPILED_MARK_ENV]).exists()  # a probe outside the shared cache marks nothing there
    mark_compiled(first)
    assert _env(runs)[COMPILE_THREADS_ENV] == "1"
    # another engine width compiles other graphs: it keeps the pool; another micro-batch loads the same graphs
    for other, same in ((["system.rollout.max_num_seqs=64"], False), (["system.batch.micro_batch_size=4"], True)):
        recipe = load_recipe(None, ["system.compile=true", *other])
        env = runner_for(recipe).env(recipe, runs / "P01", on_gpu=False)
        assert (env.get(COMPILE_THREADS_ENV) == "1") == same, other
        assert (env[COMPILED_MARK_ENV] == first[COMPILED_MARK_ENV]) == same, other
    monkeypatch.setenv(COMPILE_THREADS_ENV, "4")  # the user's count wins
    assert _env(runs)[COMPILE_THREADS_ENV] == "4"


# a matmul alone: Inductor calls aten's kernel from the graph's generated module, so the entries (that module, the
# graph's) are written without a C++ kernel's build, which takes a cold CPU compile 5x as long
_COMPILE = textwrap.dedent("""
    import sys, torch
    from tunekit.profiler.startup import cache_verdict, compile_counters
    f = torch.compile(lambda x: x @ x)
    f(torch.randn(8, 8))
    c = compile_counters()
    print(cache_verdict(c["hits"], c["misses"]), c["compile_s"] > 0)
""")


@pytest.mark.slow
def test_probes_compiling_into_one_cache_at_once_leave_entries_a_later_probe_hits(tmp_path) -> None:
    env = probe_env(None, on_gpu=False) | compile_cache_env(tmp_path / COMPILE_CACHE, {})
    run = lambda: subprocess.Popen([sys.executable, "-c", _COMPILE], env=env, text=True,  # noqa: E731
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    together = [run(), run()]
    outs = [p.communicate(timeout=600) for p in together]
    assert [p.returncode for p in together] == [0, 0], [err[-2000:] for _, err in outs]
    later = run()
    out, err = later.communicate(timeout=600)
    assert later.returncode == 0, err[-2000:]
    assert out.split() == ["hit", "True"]  # answered from the cache; Dynamo still traced


def test_start_up_is_measured_from_the_launch_and_split_into_its_parts(monkeypatch) -> None:
    import time

    from tunekit.profiler.startup import LAUNCHED_AT_ENV, StartupClock

    monkeypatch.setenv(LAUNCHED_AT_ENV, repr(time.time() - 5.0))  # launched 5 s before this process began
    clock = StartupClock()
    with clock.part("model_load"):
        time.sleep(0.05)
    clock.steps_begin()
    clock.first_step_done()
    out = clock.summary([{"timing_s/step": 3.0}, {"timing_s/step": 1.0}], {"timing_s/step": 1.0})
    assert 5.0 <= out["startup/launch_s"] < 5.5 and out["startup/model_load_s"] >= 0.05
    assert out["startup_s"] == pytest.approx(out["startup/launch_s"] + out["startup/model_load_s"]
                                             + out["startup/other_s"])
    assert (out["first_step/step_s"], out["first_step/excess_s"]) == (3.0, 2.0)


def test_compile_time_splits_into_dynamos_trace_and_the_backend_and_counts_the_graphs() -> None:
    import torch

    from tunekit.profiler.startup import StartupClock, compile_counters

    clock = StartupClock()
    clock.steps_begin()
    before = compile_counters()
    f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos(), backend="aot_eager")
    x = torch.randn(8, requires_grad=True)
    f(x).sum().backward()
    with torch.no_grad():  # grad mode is guarded: a second graph
        f(x)
    after = compile_counters()
    clock.first_step_done()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["graphs"] == 2 and delta["dynamo_s"] > 0 and delta["backend_s"] > 0
    assert delta["dynamo_s"] + delta["backend_s"] == pytest.approx(delta["compile_s"], rel=1e-6)
    out = clock.summary([{"timing_s/step": 1.0}], {})
    assert out["compile/graphs"] >= 2
    assert out["compile/dynamo_s"] + out["compile/backend_s"] == pytest.approx(out["compile/total_s"], rel=1e-6)


def test_the_launcher_says_whether_an_earlier_probe_compiled_the_shapes(tmp_path, monkeypatch) -> None:
    """Where the compiling runs outside the process that records the probe (a single controller's workers), the
    launcher's word is what tells a cold start from a warm one: written from the launch on."""
    import json

    from tunekit.estimate.cold_start import SHAPES
    from tunekit.launch.probe import check_probe, launch_probe
    from tunekit.runners.builtin import BuiltinRunner

    seen = []
    # a stand-in trainer that reads the running summary the launcher wrote before it started, and ends
    monkeypatch.setattr(BuiltinRunner, "command", lambda self, recipe, run_dir: [
        sys.executable, "-c", f"import json; print(json.load(open({str(run_dir / 'summary.json')!r}))[{SHAPES!r}])"])
    plan = check_probe(load_recipe(None, ["system.compile=true", "probe.steps=2"]))
    for name in ("P00", "P01"):
        result = launch_probe(plan, out=tmp_path / "runs", run_id=name)
        seen.append((result.summary[SHAPES], (result.run_dir / "log.txt").read_text().split()[-1]))
        if name == "P00":  # as a probe that finished a step leaves it
            env = runner_for(plan.recipe).env(plan.recipe, result.run_dir, on_gpu=False)
            mark_compiled(env)
    assert seen == [("new", "new"), ("compiled", "compiled")]
    assert json.loads((tmp_path / "runs" / "P01" / "summary.json").read_text())[SHAPES] == "compiled"


FAKE_TRAINER = textwrap.dedent("""
    import json, os, sys, time
    run = sys.argv[1]
    state, private = os.environ["TUNEKIT_COMPILE_CACHE"], os.environ["TORCHINDUCTOR_CACHE_DIR"]
    print("launched at", os.environ["TUNEKIT_LAUNCHED_AT"], flush=True)
    print("compiling into", private, flush=True)
    if state.startswith("shared") or sys.argv[2] == "always":
        json.dump({"status": "failed", "message": sys.argv[3]}, open(os.path.join(run, "error-rank0.json"), "w"))
        time.sleep(0.3)  # the first attempt's seconds, which the second's start-up must not count
        sys.exit(1)
    json.dump({"startup_s": 0.5, "steady": {}}, open(os.path.join(run, "result.json"), "w"))
""")


@pytest.mark.parametrize("fails, message, retried", [
    ("shared", "InductorError: OSError: [Errno 28] No space left on device", True),  # a full disk under a compile
    ("shared", "BackendCompilerFailed: AttributeError: module 'c43x' has no attribute 'call'", True),
    ("shared", "ValueError: task.reward returned nan", False),  # not the cache's doing: recorded as it is
    ("always", "InductorError: OSError: [Errno 28] No space left on device", True),  # failed cold too: recorded
])
def test_a_probe_the_shared_cache_failed_runs_once_more_cold_in_a_private_directory(tmp_path, monkeypatch, fails,
                                                                                      message, retried) -> None:
    from tunekit import rundir
    from tunekit.launch.probe import check_probe, launch_probe
    from tunekit.runners.builtin import BuiltinRunner

    (tmp_path / "trainer.py").write_text(FAKE_TRAINER)
    monkeypatch.setattr(BuiltinRunner, "command", lambda self, recipe, run_dir: [
        sys.executable, str(tmp_path / "trainer.py"), str(run_dir), fails, message])
    plan = check_probe(load_recipe(None, ["system.compile=true", "probe.steps=2"]))
    result = launch_probe(plan, out=tmp_path / "runs", run_id="P00")
    s, run = result.summary, result.run_dir
    assert (run / rundir.FIRST_ATTEMPT_LOG).exists() == retried
    if not retried:
        assert s["status"] == "failed" and s["reason"] == message and s["compile_cache/dir"] == "shared"
        return
    first = (run / rundir.FIRST_ATTEMPT_LOG).read_text()
    assert "runs/.compile-cache" in first and message not in (run / "log.txt").read_text()
    assert s["compile_cache/dir"].startswith("cold: the shared compile cache failed the probe's first attempt")
    assert s["compile_cache/failed_attempt_s"] > 0 and s["cost/probe_yuan"] > 0
    private = (run / "log.txt").read_text().split()[-1]
    stamp = [float(f.read_text().split("launched at ")[1].split()[0]) for f in (run / rundir.FIRST_ATTEMPT_LOG, run / "log.txt")]
    assert stamp[1] - stamp[0] >= 0.3  # the second attempt's start-up counts from its own launch
    assert "tunekit-compile-cache-" in private and not Path(private).exists()  # removed when the probe ended
    assert not rundir.read_errors(run) if fails == "shared" else rundir.read_errors(run)[0]["message"] == message
    assert s["status"] == ("ok" if fails == "shared" else "failed")


def test_vllms_compile_cache_is_read_off_its_engines_output() -> None:
    """vLLM 0.25 logs each graph it loads from its cache or compiles, once per engine and compile range."""
    from tunekit.estimate.cold_start import cache_reading
    from tunekit.profiler.startup import vllm_cache_fields

    miss = ["(EngineCore pid=7) INFO 12-05 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 9.81 s",
            "(EngineCore pid=7) INFO 12-05 [backends.py:378] Cache the graph of compile range (1, 8192) for later use"]
    hit = ["(EngineCore pid=9) INFO 12-05 [backends.py:292] Directly load the compiled graph(s) for compile range "
           "(1, 8192) from the cache, took 1.204 s"]
    assert vllm_cache_fields(miss) == {"compile_cache/vllm": "miss", "compile_cache/vllm_hits": 0,
                                       "compile_cache/vllm_misses": 1}
    assert vllm_cache_fields(hit)["compile_cache/vllm"] == "hit"
    assert vllm_cache_fields(hit + miss)["compile_cache/vllm"] == "partial"  # two engines, one found its graphs
    assert vllm_cache_fields(["INFO vLLM's torch.compile cache is disabled."] + miss) == {"compile_cache/vllm": "disabled"}
    assert vllm_cache_fields(["INFO Initial profiling/warmup run took 0.50 s"]) == {}  # an eager engine
    # a probe's cold start reads both caches: the trainer's graphs warm and the engine's cold is no full cold start
    assert cache_reading({"compile_cache/inductor": "hit", "compile_cache/vllm": "miss"}) == "partial"
    assert cache_reading({"compile_cache/vllm": "miss", "compile_cache/shapes": "compiled"}) == "miss"
    assert cache_reading({"compile_cache/inductor": "miss", "compile_cache/vllm": "disabled"}) == "miss"
