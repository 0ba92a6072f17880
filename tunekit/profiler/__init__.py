"""Measurements of a probe: phase timers, NVML sampling, communication, MFU."""

from tunekit.profiler.comm import CommProfiler, classify_kernel, exposed_comm, timed_collective_wait
from tunekit.profiler.mfu import flops_per_token, mfu
from tunekit.profiler.nvml import NvmlSampler
from tunekit.profiler.phases import PhaseTimer, steady_summary

__all__ = [
    "CommProfiler",
    "NvmlSampler",
    "PhaseTimer",
    "classify_kernel",
    "exposed_comm",
    "flops_per_token",
    "mfu",
    "steady_summary",
    "timed_collective_wait",
]
