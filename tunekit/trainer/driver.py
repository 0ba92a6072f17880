"""Single-controller driver: ``python -m tunekit.trainer.driver RUN_DIR``.

One process runs the loop on the whole batch and dispatches each phase to role
worker groups on Ray, placed by the device map. It writes the same records as an
spmd rank 0 (steps.jsonl, steps.parquet, result.json; error-rank0.json with
status oom / failed on failure) and shuts Ray down at the end.

Without ``system.ray_address`` it starts a fresh local Ray cluster whose
processes live in the probe's session, so the launcher can kill them with it; with
``system.simulate_nodes`` that cluster is a head and one Ray node per further node
(:mod:`tunekit.trainer.ray_nodes`), which it stops when it ends.

SIGTERM ends the driver at once, as it ends an spmd rank: the launcher sends it to stop a probe (its timeout, a
hang) and then kills whatever is left of the probe's session, so Ray's own handler, which dumps stacks and shuts
down for seconds, would only make every stopped probe wait.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import torch

from tunekit.config import Recipe
from tunekit.placement.dist import Dist
from tunekit.placement.gpus import on_gpu
from tunekit.config.errors import error_record
from tunekit.rundir import (
    POLICY,
    RAY,
    WORKERS,
    EvalSampleLog,
    SampleLog,
    StepLog,
    read_config,
    write_error,
    write_json,
    write_result,
)
from tunekit.trainer.entry import run_steps
from tunekit.profiler.startup import StartupClock
from tunekit.trainer.faults import fault_for
from tunekit.trainer.loop import Roles, Trainer
from tunekit.trainer.ray_nodes import RayNodes, start_nodes, wait_for_nodes
from tunekit.trainer.save_policy import write_policy
from tunekit.placement.backends import backend_of, rollout_shares_trainer_gpus


def worker_roles(recipe: Recipe) -> list[str]:
    """The roles that get a worker group: every needed role, except a vLLM server client."""
    roles = recipe.roles
    # a running server given by URL (no rollout devices): the rollout is a client in this process
    if backend_of(recipe.system.rollout).external(recipe.system.rollout) and not recipe.system.device_map.get("rollout"):
        roles.remove("rollout")
    return roles


RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # every role worker is an actor in a process of its own: the idle workers Ray starts for a new driver's tasks
    # would only be stopped again, after costing a Python start each
    "RAY_prestart_worker_first_driver": "0",
}
"""Set for this driver and the Ray processes it starts, where the environment does not say otherwise."""


def connect(recipe: Recipe, run: Path, nodes: RayNodes | None = None) -> dict[str, Any]:
    """``ray.init`` the simulated ``nodes`` this driver started, else the cluster at ``system.ray_address``, else
    a fresh local one.

    Ray retries an address that does not answer for minutes, so a watchdog records a
    clear error and ends the process after ``system.ray_timeout_s``.
    """
    import ray

    sysc = recipe.system
    address, timeout = sysc.ray_address, sysc.ray_timeout_s

    def give_up() -> None:
        where = f"the Ray cluster at system.ray_address={address}" if address else "a local Ray cluster"
        write_error(run, 0, {"status": "failed", "message": (
            f"{where} did not answer within system.ray_timeout_s={timeout:g} s; check the head's address "
            "(host:port, e.g. 10.0.0.1:6379) and that it is up, or unset system.ray_address for a local cluster.")})
        sys.stderr.flush()
        os._exit(1)

    watchdog = threading.Timer(timeout, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        if nodes is not None:
            address = nodes.address
            ray.init(address=address, log_to_driver=True)
        elif address:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        else:  # logical CPUs: one per device slot at least, whatever the machine has
            ray.init(address="local", include_dashboard=False, log_to_driver=True,
                     num_cpus=max(os.cpu_count() or 1, len(sysc.devices)))
    finally:
        watchdog.cancel()
    if nodes is not None:  # every node is up and has its resource before a worker is placed; one that is not says why
        wait_for_nodes(sysc.nnodes, timeout, run)
    info = {"address": address or "local", "session_dir": _session_dir(), "driver_pid": os.getpid(),
            "nodes": sysc.nnodes, "simulated_nodes": nodes is not None}
    write_json(run / RAY, info)
    return info


def _session_dir() -> str | None:
    try:
        import ray

        return ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - only recorded for debugging
        return None


class ControllerTrainer(Trainer):
    """The loop on the driver; each step also records the allocator peaks of ``groups``' workers (GPU)."""

    def __init__(self, *args: Any, groups: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups = groups

    def step(self, step: int) -> dict[str, float]:
        metrics = super().step(step)
        return metrics | memory_metrics(self.groups)


def memory_metrics(groups: dict) -> dict[str, float]:
    """Step peaks: the largest worker's, and per device index the sum over the workers sharing it (GiB)."""
    import ray

    handles = [(g, rank) for g in groups.values() for rank in range(g.world)]
    peaks = ray.get([g.workers[rank].peak_memory.remote() for g, rank in handles])
    out: dict[str, float] = {}
    for (g, rank), p in zip(handles, peaks):
        if not p:
            continue
        for kind in ("allocated", "reserved"):
            key = f"perf/max_memory_{kind}_gb"
            out[key] = max(out.get(key, 0.0), p[kind])
            dev_key = f"{key}/device{g.devices[rank]}"
            out[dev_key] = out.get(dev_key, 0.0) + p[kind]
    return out


def build_roles(recipe: Recipe, groups: dict, tokenizer) -> Roles:
    rollout = groups.get("rollout")
    if rollout is None:  # a vLLM server client, driven from here
        from tunekit.trainer.build import build_rollout

        rollout = build_rollout(recipe, Dist(), tokenizer)
    return Roles(actor=groups["actor"], ref=groups.get("ref"), critic=groups.get("critic"), rollout=rollout,
                 reward=groups["reward"], colocated_rollout=rollout_shares_trainer_gpus(recipe.system))


def train(recipe: Recipe, run: Path, clock: StartupClock, *, remote: bool) -> None:
    from tunekit.profiler.session import ProfilerSession
    from tunekit.trainer.build import build_task, load_tokenizer
    from tunekit.trainer.worker_group import link_collective_sync, start_groups

    gpu = on_gpu(recipe.system.device)
    with clock.part("workers_start"):  # the role workers, each loading its model
        groups = start_groups(recipe, worker_roles(recipe), gpu=gpu, timeout_s=recipe.system.ray_timeout_s,
                              remote=remote)
    if recipe.system.weight_sync == "collective":
        link_collective_sync(groups["actor"], groups["rollout"])
    write_json(run / WORKERS, {role: g.info for role, g in groups.items()})
    with clock.part("setup"):
        tokenizer, task = load_tokenizer(recipe), build_task(recipe)
    with clock.part("engine_start"):  # a rollout the driver runs itself (a server)
        roles = build_roles(recipe, groups, tokenizer)
    # the driver holds the whole batch and computes nothing on a device
    dist = Dist(device=torch.device("cuda" if gpu else "cpu"))
    gpus = sorted({i for g in groups.values() for info in g.info for i in info["gpu_ids"]}) if gpu else None
    # the driver samples every node's GPUs (simulated nodes share this host), each under its node
    nodes = ({i: info["node"] for g in groups.values() for info in g.info for i in info["gpu_ids"]}
             if gpu and recipe.system.nnodes > 1 else None)

    fault = fault_for(recipe)

    def inject(step: int) -> None:
        # the fault hits the actor group's last rank, as it hits the last rank under spmd
        if fault != "none":
            groups["actor"].inject_fault(fault, step)

    with ProfilerSession(recipe, run, dist, gpus=gpus or None, remote_workers=True, nodes=nodes) as prof:
        trainer = ControllerTrainer(recipe, roles, tokenizer=tokenizer, task=task, dist=dist, timer=prof.timer,
                                    shard_world=1, groups=groups if gpu else {}, samples=SampleLog(run, recipe.probe),
                                    eval_samples=EvalSampleLog(run))
        result = run_steps(recipe, trainer, StepLog(run), dist, clock, inject=inject)
    if recipe.probe.save_policy:  # the actor group gathers its weights; the driver writes them
        result[POLICY] = str(write_policy(recipe, groups["actor"].full_state_dict(), tokenizer, run))
    write_result(run, result | prof.summary() | {"controller": "single"})


def failure(e: BaseException) -> dict[str, Any]:
    """The error record for the launcher; a worker's exception arrives wrapped by Ray."""
    cause = getattr(e, "cause", None) or e
    record = error_record(cause, traceback.format_exc().splitlines())
    return record | {"message": record["message"].splitlines()[0]}


def main(run_dir: str) -> int:
    clock = StartupClock()
    run = Path(run_dir)
    code = 0
    try:
        recipe = read_config(run)
        sysc = recipe.system
        for key, value in RAY_ENV.items():
            os.environ.setdefault(key, value)
        # before Ray is imported: it reads its authentication settings once, at import
        with clock.part("ray_start"):  # the simulated nodes, then Ray's import and its cluster joined
            nodes = (start_nodes(recipe, run, gpu=on_gpu(sysc.device), timeout_s=sysc.ray_timeout_s)
                     if sysc.nnodes > 1 and sysc.simulate_nodes else None)
            import ray

        try:
            with clock.part("ray_start"):
                connect(recipe, run, nodes)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # after ray.init, which installs Ray's handler
            train(recipe, run, clock, remote=bool(sysc.ray_address))
        finally:
            ray.shutdown()
            if nodes is not None:
                nodes.stop()
    except Exception as e:  # noqa: BLE001 - any failure is a recorded outcome
        record = failure(e)
        write_error(run, 0, record)
        code = 3 if record["status"] == "oom" else 1
    return code


if __name__ == "__main__":
    rc = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown: Ray's exit hooks can stall after a failed connection
