"""PhaseTimer, steady_summary, NvmlSampler and MFU on CPU; one GPU-only test."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import subprocess
import sys
import time
import types
import warnings

import pandas as pd
import psutil
import pytest
import torch

from tunekit.estimate.memory import measured_peak
from tunekit.profiler import NvmlSampler, PhaseTimer, flops_per_token, mfu, steady_summary
from tunekit.profiler import nvml as nvml_mod

# time.sleep never returns early; scheduler noise on a loaded CI box can add
# tens of milliseconds, so upper bounds get a wide margin.
SLACK_S = 0.15


def test_phase_timer_times_each_phase_and_the_step() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step()
    outer = {}
    for name, sleep_s in (("gen", 0.1), ("update_actor", 0.05)):
        start = time.perf_counter()
        with timer.phase(name):
            time.sleep(sleep_s)
        outer[name] = time.perf_counter() - start  # the phase's block as seen from outside: its time and no other's
    row = timer.end_step()
    assert 0.1 <= row["timing_s/gen"] <= outer["gen"]
    assert 0.05 <= row["timing_s/update_actor"] <= outer["update_actor"]
    assert row["timing_s/step"] >= row["timing_s/gen"] + row["timing_s/update_actor"]
    assert not any(k.startswith("perf/max_memory") for k in row)  # no allocator peaks on CPU


def test_phase_entered_twice_sums_and_next_step_starts_clean() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step()
    for _ in range(2):
        with timer.phase("gen"):
            time.sleep(0.05)
    assert timer.end_step()["timing_s/gen"] >= 0.1
    timer.start_step()
    assert timer.metrics == {}
    assert set(timer.end_step()) == {"timing_s/step", "perf/gc_s", "perf/gc_full_collections"}


def test_phase_that_raises_records_nothing() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step()
    with pytest.raises(RuntimeError), timer.phase("gen"):
        raise RuntimeError("boom")
    assert "timing_s/gen" not in timer.end_step()


class Cycle:
    pass


def test_gc_pauses_are_charged_to_the_step_and_the_phase_they_ran_in() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step()
    with timer.phase("gen"):
        for _ in range(20_000):  # cyclic garbage, then a full collection, as a long decode loop meets one
            c = Cycle()
            c.me = c
        gc.collect()
    with timer.phase("update_actor"):
        time.sleep(0.01)
    row = timer.end_step()
    assert row["perf/gc_full_collections"] >= 1
    assert row["perf/gc_s/gen"] > 0
    assert row["perf/gc_s"] >= row["perf/gc_s/gen"] + row["perf/gc_s/update_actor"]
    assert row["perf/gc_s/update_actor"] < row["perf/gc_s/gen"]
    timer.start_step()
    gc.collect()  # in the step but in no phase: the step's only
    row = timer.end_step()
    assert row["perf/gc_full_collections"] >= 1 and not any(k.startswith("perf/gc_s/") for k in row)
    assert timer._gc._on_gc not in gc.callbacks  # listening only while a step runs


class SlowStartComm:
    """A communication profiler whose step start takes a while, as its warm-up session does."""

    def start_step(self, step: int) -> None:
        time.sleep(0.3 if step == 1 else 0.0)

    def phase(self, name: str):
        return contextlib.nullcontext()

    def end_step(self) -> dict[str, float]:
        return {}


def test_the_comm_profilers_step_start_is_overhead_not_step_time() -> None:
    timer = PhaseTimer(torch.device("cpu"), comm=SlowStartComm())
    rows = []
    for _ in range(2):
        timer.start_step()
        with timer.phase("gen"):
            time.sleep(0.01)
        rows.append(timer.end_step())
    assert rows[1]["profiler/overhead_s"] >= 0.3 > rows[0]["profiler/overhead_s"]
    assert rows[1]["timing_s/step"] < 0.01 + SLACK_S < 0.3


class CollectingComm(SlowStartComm):
    """A communication profiler whose start and phase entry each run a full collection, as its sessions'
    allocations can set one off."""

    def start_step(self, step: int) -> None:
        gc.collect()

    @contextlib.contextmanager
    def phase(self, name: str):
        gc.collect()
        yield


def test_a_collection_inside_the_profilers_own_time_is_not_the_steps() -> None:
    timer = PhaseTimer(torch.device("cpu"), comm=CollectingComm())
    timer.start_step()
    with timer.phase("gen"):
        time.sleep(0.01)
    row = timer.end_step()
    assert row["perf/gc_s/gen"] == 0.0
    assert row["perf/gc_s"] == pytest.approx(0.0, abs=1e-9) and row["perf/gc_full_collections"] == 0.0
    timer.start_step()
    with timer.phase("gen"):
        gc.collect()  # inside the phase: the step's and the phase's
    row = timer.end_step()
    assert row["perf/gc_s"] == pytest.approx(row["perf/gc_s/gen"]) and row["perf/gc_s/gen"] > 0
    assert row["perf/gc_full_collections"] == 1.0


def test_end_step_without_start_step_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="start_step"):
        PhaseTimer(torch.device("cpu")).end_step()


class _FakeAllocator:
    """Mimics the CUDA caching allocator's current/peak/reset semantics."""

    def __init__(self) -> None:
        self.current = 0.0
        self.peak = 0.0

    def set(self, gb: float) -> None:
        self.current = gb
        self.peak = max(self.peak, gb)

    def read(self) -> tuple[float, float]:
        return self.peak, self.peak + 1.0  # reserved = allocated + 1 GiB

    def reset(self) -> None:
        self.peak = self.current


def _timer_with_fake_memory() -> tuple[PhaseTimer, _FakeAllocator]:
    timer = PhaseTimer(torch.device("cpu"))
    alloc = _FakeAllocator()
    timer._track_memory = True  # exercise the CUDA bookkeeping without a GPU
    timer._read_peaks = alloc.read  # type: ignore[method-assign]
    timer._reset_peaks = alloc.reset  # type: ignore[method-assign]
    return timer, alloc


def test_memory_peaks_per_phase_and_step() -> None:
    timer, alloc = _timer_with_fake_memory()
    timer.start_step()
    with timer.phase("gen"):
        alloc.set(5.0)
        alloc.set(1.0)
    with timer.phase("update_actor"):
        alloc.set(3.0)
    row = timer.end_step()
    assert row["perf/max_memory_allocated_gb/gen"] == 5.0
    assert row["perf/max_memory_allocated_gb/update_actor"] == 3.0  # the reset forgot gen's 5
    assert row["perf/max_memory_reserved_gb/update_actor"] == 4.0
    assert row["perf/max_memory_allocated_gb"] == 5.0
    assert row["perf/max_memory_reserved_gb"] == 6.0


def test_nested_phase_does_not_erase_the_outer_peak() -> None:
    timer, alloc = _timer_with_fake_memory()
    timer.start_step()
    with timer.phase("update_actor"):
        alloc.set(7.0)
        alloc.set(2.0)
        with timer.phase("micro_batch"):
            alloc.set(4.0)
    row = timer.end_step()
    assert row["perf/max_memory_allocated_gb/micro_batch"] == 4.0
    assert row["perf/max_memory_allocated_gb/update_actor"] == 7.0


def test_steady_summary_skips_warmup_and_takes_max_for_memory() -> None:
    rows = [
        {"step": 0, "timing_s/gen": 100.0, "perf/max_memory_allocated_gb": 50.0},
        {"step": 1, "timing_s/gen": 1.0, "perf/max_memory_allocated_gb": 3.0, "reward/mean": 0.5},
        {"step": 2, "timing_s/gen": 3.0, "perf/max_memory_allocated_gb": 4.0},
        {"step": 3, "timing_s/gen": 2.0, "perf/max_memory_allocated_gb": 2.0, "comm/wait_s/gen": 0.4},
        {"step": 4, "timing_s/gen": float("nan"), "perf/throughput": 10.0, "perf/flag": True, "response_length/mean": 7.0},
    ]
    for row, pause in zip(rows, [9.0, 0.0, 0.0, 0.0, 1.2]):  # GC pauses: rare and long
        row["perf/gc_s"] = pause
    out = steady_summary(rows, warmup_steps=1)
    assert out == {
        "timing_s/gen": 2.0,
        "perf/max_memory_allocated_gb": 4.0,
        "perf/throughput": 10.0,
        "comm/wait_s/gen": 0.4,
        "perf/gc_s": pytest.approx(0.3),  # the mean, where the median would be 0
        "response_length/mean": 7.0,  # the actor's MFU counts its LM head on these tokens
    }


def test_steady_summary_rejects_a_warmup_that_leaves_nothing() -> None:
    with pytest.raises(ValueError, match="no steady step"):
        steady_summary([{"timing_s/gen": 1.0}], warmup_steps=1)
    with pytest.raises(ValueError, match=">= 0"):
        steady_summary([{"timing_s/gen": 1.0}], warmup_steps=-1)


@pytest.mark.parametrize("interval", [0, -0.5])
def test_nvml_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        NvmlSampler(interval_s=interval)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path taken without GPUs")
def test_nvml_disabled_without_gpu(tmp_path) -> None:
    with pytest.warns(RuntimeWarning, match="NVML sampling disabled") as record:
        with NvmlSampler([0]) as sampler:
            time.sleep(0.05)
    assert len(record) == 1
    assert sampler.available is False and sampler.reason
    assert sampler.to_frame().empty
    sampler.write_parquet(tmp_path / "nvml.parquet")
    assert pd.read_parquet(tmp_path / "nvml.parquet").empty
    summary = sampler.summary()
    assert summary["nvml/available"] is False and summary["nvml/energy_j"] is None


def _fake_pynvml(*, energy: bool, fail_after: int | None = None) -> types.SimpleNamespace:
    """A pynvml stand-in with two GPUs; memory reads fail after `fail_after` calls."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    state = {"reads": 0, "energy": {0: 1_000_000.0, 1: 2_000_000.0}}

    def memory_info(h: int) -> types.SimpleNamespace:
        state["reads"] += 1
        if fail_after is not None and state["reads"] > fail_after:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(used=(h + 1) * 2**30)

    def total_energy(h: int) -> float:
        if not energy:
            raise NVMLError_NotSupported("no counter")
        state["energy"][h] += 5_000.0  # +5 J per read
        return state["energy"][h]

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported, NVML_CLOCK_SM=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + 10 * h),
        nvmlDeviceGetPowerUsage=lambda h: 100_000.0,  # 100 W in mW
        nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=7, usedGpuMemory=2**30)],
        nvmlDeviceGetTotalEnergyConsumption=total_energy,
    )


def test_nvml_sampler_with_fake_driver(monkeypatch) -> None:
    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: _fake_pynvml(energy=True))
    with NvmlSampler(interval_s=0.02) as sampler:
        time.sleep(0.1)
    frame = sampler.to_frame()
    assert set(frame["gpu"]) == {0, 1} and len(frame) >= 4
    assert frame["proc_mem_used_gb"].eq(1.0).all()
    assert set(sampler.process_frame()["pid"]) == {7}
    summary = sampler.summary()
    assert summary["nvml/available"] is True and sampler.error is None
    assert summary["nvml/mem_used_gb/1"] == 2.0 and summary["nvml/util_mean/1"] == 60.0
    assert summary["nvml/energy_j/0"] == 5.0 and summary["nvml/energy_j"] == 10.0
    assert summary["nvml/energy_method"] == "counter"


def test_nvml_own_peak_leaves_out_another_job_on_the_card(monkeypatch) -> None:
    """Two jobs share GPU 0: the probe's child process holds 3 GiB, a process outside its tree 5 GiB, the driver
    0.5 GiB that no process holds. The card's peak counts all of it; the probe's own peak (what the memory estimate
    is checked against) counts its child and the driver's share. GPU 1 holds only the other job's process: no own
    peak there, the probe's share of it is not known."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        foreign = os.getppid()  # above this process, so outside its tree
        fake = _fake_pynvml(energy=True)
        procs = {0: [types.SimpleNamespace(pid=child.pid, usedGpuMemory=3 * 2**30),
                     types.SimpleNamespace(pid=foreign, usedGpuMemory=5 * 2**30)],
                 1: [types.SimpleNamespace(pid=foreign, usedGpuMemory=2**30)]}
        fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=int((8.5 if h == 0 else 1.5) * 2**30))
        fake.nvmlDeviceGetComputeRunningProcesses = lambda h: procs[h]
        monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: fake)
        with NvmlSampler(interval_s=0.02, root=os.getpid()) as sampler:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    summary = sampler.summary()
    assert summary["nvml/mem_used_gb/0"] == 8.5
    assert summary["nvml/own_mem_used_gb/0"] == pytest.approx(3.5)
    assert "nvml/own_mem_used_gb/1" not in summary
    assert measured_peak(summary) == pytest.approx(3.5)
    own = sampler.process_frame().groupby("pid")["own"].all()
    assert own[child.pid] and not own[foreign]


def test_nvml_process_tree_holds_the_root_and_its_descendants() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while len(nvml_mod.process_tree(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = nvml_mod.process_tree(os.getpid())
        assert {os.getpid(), child.pid} <= tree and len(tree) >= 3 and os.getppid() not in tree
    finally:
        for p in psutil.Process(child.pid).children(recursive=True):
            p.kill()
        child.kill()
        child.wait()
    assert nvml_mod.process_tree(child.pid) == set()


def test_nvml_error_mid_run_stops_sampling_and_integrates_power(monkeypatch) -> None:
    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: _fake_pynvml(energy=False, fail_after=6))
    with NvmlSampler([0], interval_s=0.02) as sampler:
        time.sleep(0.3)
    assert sampler.error is not None and "GPU is lost" in sampler.error
    assert len(sampler.samples) == 6
    span = sampler.samples[-1]["time"] - sampler.samples[0]["time"]
    assert sampler.summary()["nvml/energy_method"] == "power_integral"
    assert math.isclose(sampler.energy_j[0], 100.0 * span)


def test_nvml_rejects_a_gpu_index_it_does_not_see(monkeypatch) -> None:
    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: _fake_pynvml(energy=True))
    with pytest.raises(ValueError, match=r"gpus \[5\] do not exist"):
        with NvmlSampler([0, 5]):
            pass


def test_flops_per_token_and_mfu() -> None:
    # 0.5B params, 24 layers, hidden 896, 1024 tokens: 6N + 12*L*H*S
    fpt = flops_per_token(500_000_000, 24, 896, 1024)
    assert fpt == 6 * 500_000_000 + 12 * 24 * 896 * 1024
    assert mfu(10_000.0, fpt, peak_tflops=None) is None
    assert math.isclose(mfu(10_000.0, fpt, peak_tflops=989.0), 10_000.0 * fpt / 989e12)
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu(1.0, fpt, peak_tflops=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_phase_timer_and_nvml_on_cuda() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    timer = PhaseTimer(device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NVML must be available on a GPU machine
        sampler = NvmlSampler([torch.cuda.current_device()], interval_s=0.05)
    held_gb = torch.cuda.memory_allocated(device) / 2**30  # what earlier tests in this process still hold
    with sampler:
        timer.start_step()
        with timer.phase("alloc"):
            x = torch.empty(2**28, dtype=torch.float32, device=device)  # 1 GiB
            x.fill_(1.0)
            del x
        with timer.phase("small"):
            torch.ones(16, device=device).sum()
        row = timer.end_step()
    assert row["perf/max_memory_allocated_gb/alloc"] >= held_gb + 1.0
    assert row["perf/max_memory_allocated_gb/small"] < held_gb + 0.5  # reset at phase start
    assert row["perf/max_memory_allocated_gb"] >= 1.0
    summary = sampler.summary()
    assert summary["nvml/available"] is True, summary
    assert summary[f"nvml/mem_used_gb/{torch.cuda.current_device()}"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_machine_is_named_by_the_gpus_nvidia_smi_lists(monkeypatch) -> None:
    """On a GPU machine NVML reads the UUIDs the driver's own tool lists, and they enter the machine's digest."""
    import shutil
    import subprocess

    from tunekit.profiler import machine

    if shutil.which("nvidia-smi") is None:
        pytest.skip("needs nvidia-smi to list the GPUs' UUIDs")
    listed = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert listed and sorted(machine.gpu_uuids()) == sorted(listed)
    here = machine.machine_id()
    monkeypatch.setattr(machine, "gpu_uuids", lambda: [])
    assert machine.machine_id() != here  # the GPUs, not the host's name alone, tell this machine apart


def test_update_mfu_counts_epochs_and_gpus():
    from tunekit.profiler.mfu import update_mfu

    # 1000 tokens x 2 epochs in 2 s on 2 GPUs = 500 tokens/s/GPU; 6*1e9 + 12*2*64*10 flops each; peak 100 TFLOP/s
    got = update_mfu(tokens=1000, seq_len=10, epochs=2, n_params=10**9, n_layers=2, hidden=64, seconds=2.0, gpus=2,
                     peak_tflops=100.0)
    assert got == pytest.approx(500 * (6e9 + 12 * 2 * 64 * 10) / 100e12)
    assert update_mfu(tokens=1000, seq_len=10, epochs=1, n_params=1, n_layers=1, hidden=1, seconds=1.0, gpus=1,
                      peak_tflops=None) is None
    # an LM head of 4e8 of those parameters run on 300 of the 1000 tokens only (logits_to_keep)
    head = update_mfu(tokens=1000, seq_len=10, epochs=2, n_params=10**9, n_layers=2, hidden=64, seconds=2.0, gpus=2,
                      peak_tflops=100.0, head_params=4 * 10**8, head_tokens=300)
    assert head == pytest.approx(500 * (6 * 6e8 + 12 * 2 * 64 * 10 + 0.3 * 6 * 4e8) / 100e12)


def test_probe_perf_metrics_per_gpu_held_and_unknown_peak():
    from tunekit.config import load_recipe
    from tunekit.launch.probe import perf_metrics
    from tunekit.estimate.profiles import load_profile

    r = load_recipe(None, ["system.device_map={actor:[0,1],critic:[0,1],ref:[0,1],rollout:[0,1],reward:[0,1]}"])
    steady = {"perf/total_tokens": 4000.0, "timing_s/step": 2.0, "timing_s/update_actor": 0.5, "timing_s/update_critic": 0.25}
    cpu = perf_metrics(r, steady, 2, load_profile("cpu"))
    assert cpu["perf/throughput"] == pytest.approx(1000.0) and cpu["perf/mfu/actor"] is None
    h200 = perf_metrics(r, steady, 2, load_profile("h200"))
    # the critic took half the time, for the same tokens through the backbone without the LM head
    assert h200["perf/mfu/actor"] < h200["perf/mfu/critic"] < 2 * h200["perf/mfu/actor"]
    assert 0 < h200["perf/mfu/actor"] < 1
    # with the response length known, the actor's LM head counts on the response tokens only: fewer FLOPs
    short = perf_metrics(r, steady | {"response_length/mean": 2.0}, 2, load_profile("h200"))
    assert short["perf/mfu/actor"] < h200["perf/mfu/actor"] and short["perf/mfu/critic"] == h200["perf/mfu/critic"]


def test_a_probe_on_cpu_priced_as_a_gpu_has_no_mfu_and_its_response_length_reaches_the_actors(tmp_path):
    """A CPU probe priced with a GPU's profile pays that price but gets no MFU against that GPU's peak; on a GPU the
    steady response length makes the actor's LM head count on response tokens only."""
    import json

    from tunekit import rundir
    from tunekit.config import load_recipe
    from tunekit.estimate.profiles import load_profile
    from tunekit.launch import probe

    r = load_recipe(None, ["system.device=cpu", "probe.warmup_steps=1"])
    run = tmp_path / "P00"
    run.mkdir()
    rundir.write_config(run, r)
    rows = [{"step": i, "timing_s/step": 2.0, "timing_s/update_actor": 0.5, "perf/total_tokens": 4000.0,
             "response_length/mean": 3.0, "reward/mean": 0.1} for i in range(3)]
    (run / rundir.STEPS_LIVE).write_text("".join(json.dumps(x) + "\n" for x in rows))
    s = probe.summarize(r, run, "ok", "", 10.0, load_profile("h200"))
    assert s["gpus_held"] == 0 and s["perf/mfu/actor"] is None and s["cost/probe_yuan"] > 0
    assert s["steady"]["response_length/mean"] == 3.0
    on_gpu = probe.perf_metrics(r, s["steady"], 1, load_profile("h200"))
    whole = probe.perf_metrics(r, {k: v for k, v in s["steady"].items() if k != "response_length/mean"}, 1,
                               load_profile("h200"))
    assert 0 < on_gpu["perf/mfu/actor"] < whole["perf/mfu/actor"]


def test_steady_timing_leaves_out_the_steps_sampled_for_communication():
    rows = [{"timing_s/step": 9.0}, {"timing_s/step": 1.0, "comm/sampled": 1.0, "comm/total_s/x": 0.2},
            {"timing_s/step": 1.1, "comm/sampled": 1.0, "comm/total_s/x": 0.4}, {"timing_s/step": 0.5},
            {"timing_s/step": 0.7}]
    s = steady_summary(rows, 1)
    assert s["timing_s/step"] == pytest.approx(0.6)          # unsampled steps 3 and 4 only
    assert s["comm/total_s/x"] == pytest.approx(0.3)         # comm keys come from the sampled steps
    all_sampled = [{"timing_s/step": 2.0, "comm/sampled": 1.0}, {"timing_s/step": 4.0, "comm/sampled": 1.0}]
    assert steady_summary(all_sampled, 0)["timing_s/step"] == pytest.approx(3.0)


def test_comm_windows_default_to_the_probes_last_steps_after_warmup():
    from tunekit.config import load_recipe
    from tunekit.profiler.session import comm_sample_steps

    def steps(*sets):
        return list(comm_sample_steps(load_recipe(None, list(sets))))

    # the last 3 of 100: every steady step before them runs unprofiled (profiling slows what follows it)
    assert steps("probe.steps=100", "probe.warmup_steps=3") == [97, 98, 99]
    assert steps("probe.steps=6", "probe.warmup_steps=2") == [3, 4, 5]
    assert steps("probe.steps=4", "probe.warmup_steps=3") == [3]            # never a warm-up step
    assert steps("probe.steps=5", "probe.warmup_steps=1", "profiler.comm_start_step=1") == [1, 2, 3]
    assert steps("probe.steps=100", "profiler.comm_steps=0") == []


def test_one_rank_generating_in_its_own_process_is_not_profiled_for_communication():
    from tunekit.config import load_recipe
    from tunekit.placement.dist import Dist
    from tunekit.profiler.session import why_no_comm

    def why(world, *sets, remote=False):
        return why_no_comm(load_recipe(None, list(sets)), Dist(world=world), remote_workers=remote)

    assert why(1) == why(1, "system.rollout.backend=vllm") == "one rank: no collectives"
    assert why(2) is None  # the ranks' gradients are reduced: NCCL waits to measure
    assert why(1, "system.rollout.backend=vllm_server") is None  # its weights may reach a server over NCCL
    assert why(1, "profiler.trace=true") is None  # the traces were asked for
    assert why(2, remote=True) == "single controller"  # the collectives run in the workers
