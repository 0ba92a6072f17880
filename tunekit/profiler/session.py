"""Everything the profiler does for one probe process, behind one context manager."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.placement.backends import backend_of
from tunekit.placement.dist import Dist
from tunekit.placement.gpus import nvml_indices
from tunekit.profiler.comm import CommProfiler
from tunekit.profiler.nvml import COLUMNS, NvmlSampler, merge_node_summaries, probe_summary, save_samples
from tunekit.profiler.phases import PhaseTimer


def comm_sample_steps(recipe: Recipe) -> range:
    """Steps profiled for communication: the probe's last ``comm_steps`` (never warm-up steps) unless the recipe
    says otherwise.

    Last, because a CUDA profiler session leaves kernel launches slower for the rest of the process (CUPTI is
    not torn down: pytorch/pytorch#144455). Steps before the windows (and before the profiler's warm-up, the step before
    them) are what a training run pays, and what the steady medians and the cost projection are built from.
    """
    p, probe = recipe.profiler, recipe.probe
    after_warmup = min(probe.warmup_steps, probe.steps - 1)
    start = p.comm_start_step if p.comm_start_step is not None else max(after_warmup, probe.steps - p.comm_steps)
    return range(start, min(start + p.comm_steps, probe.steps))


def why_no_comm(recipe: Recipe, dist: Dist, *, remote_workers: bool) -> str | None:
    """Why this process profiles no communication (None: it does). A single controller's collectives run in its
    workers; one trainer rank beside an engine in its own process has none (a rollout server may still take its
    weights over NCCL), and profiling it would only slow the probe, unless ``profiler.trace`` asks for the traces."""
    if remote_workers:
        return "single controller"
    if dist.world == 1 and backend_of(recipe.system.rollout).in_trainer_ranks and not recipe.profiler.trace:
        return "one rank: no collectives"
    return None


class ProfilerSession:
    """Phase timer (+ communication windows) for the loop, NVML sampling on the main rank.

    ``gpus`` are the physical indices NVML should sample (the device map's GPUs);
    ignored on CPU. ``nodes`` maps them to the nodes that hold them when the probe spans
    several: each node's first rank then samples its own node's GPUs (``gpus``), and on
    leaving the session rank 0 gathers every node's samples and summary.

    ``remote_workers``: the loop runs in a single-controller driver and its work in Ray
    workers. Phases are timed on the host clock (each remote call returns when the
    workers are done) and communication is not profiled here (the collectives run in
    the workers).
    """

    def __init__(self, recipe: Recipe, run_dir: Path, dist: Dist, gpus: list[int] | None = None, *,
                 remote_workers: bool = False, nodes: dict[int, int] | None = None) -> None:
        self.run_dir, self.dist = Path(run_dir), dist
        self.node_parts: list[tuple[dict[str, Any], list[dict]]] | None = None
        trace_dir = rundir.trace_dir(self.run_dir, dist.rank) if recipe.profiler.trace else None
        self.no_comm = why_no_comm(recipe, dist, remote_workers=remote_workers)
        self.comm = None if self.no_comm else CommProfiler(dist.device.type, comm_sample_steps(recipe), trace_dir,
                                                           skip_phases=recipe.profiler.comm_skip_phases)
        self.timer = PhaseTimer("cpu" if remote_workers else dist.device, comm=self.comm)
        self.nvml: NvmlSampler | None = None
        sampler = dist.is_node_main if dist.nnodes > 1 else dist.is_main
        if sampler and dist.device.type == "cuda":
            self.nvml = NvmlSampler(gpus if gpus is not None else nvml_indices(recipe.system.devices),
                                    interval_s=recipe.profiler.nvml_interval_s, nodes=nodes)

    def __enter__(self) -> "ProfilerSession":
        if self.nvml is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.nvml.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.nvml is not None:
            self.nvml.__exit__(*exc)
        if self.dist.nnodes > 1 and self.dist.device.type == "cuda" and exc[0] is None:
            mine = (self.nvml.summary(), list(self.nvml.samples)) if self.nvml is not None else None
            parts = [p for p in self.dist.gather(mine) if p is not None]
            if self.dist.is_main:
                self.node_parts = parts
                rows = [row for _, samples in parts for row in samples]
                if rows:
                    import pandas as pd

                    pd.DataFrame(rows, columns=COLUMNS).to_parquet(rundir.nvml_path(self.run_dir), index=False)
            return
        save_samples(self.nvml, rundir.nvml_path(self.run_dir))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.comm.summary()) if self.comm else {"comm/method": f"not measured ({self.no_comm})"}
        if self.node_parts is not None:
            return out | merge_node_summaries([summary for summary, _ in self.node_parts])
        return out | probe_summary(self.nvml)
