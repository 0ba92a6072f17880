"""Simulated nodes for the single controller: a Ray head and one Ray node per further node, all on this host.

Each node is one ``ray start --block`` process (what a machine of a real cluster runs) with the CPUs and GPUs of
its slice of the device map (:func:`tunekit.placement.nodes.node_devices`; only those GPUs visible to it) and the custom
resource ``nodeN``, one unit per device slot, through which :func:`tunekit.trainer.worker_group.placement` puts
each worker on its node. Each node's output goes to ``ray-node<N>.log`` in the run directory, and a node that fails
to start or join is reported with the last lines of its log. The driver connects with ``ray.init(address=...)`` and
stops the nodes it started when it ends: SIGTERM to each ``ray start --block`` ends that node's Ray processes, and
only those (``ray stop`` would end every Ray cluster of the host). Should the driver die first, the launcher still
ends them: they live in the probe's session.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.placement.nodes import NODE_RESOURCE, node_devices, simulated_node_env
from tunekit.placement.ports import free_port

STOP_GRACE_S = 15.0
TAIL_LINES = 5
"""Lines of a node's log quoted when it fails to start or join."""


@dataclass
class RayNodes:
    """The Ray nodes a driver started: the head's address and one ``ray start --block`` process per node."""

    address: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """End every node this driver started (their own Ray processes with them), head last."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def node_command(recipe: Recipe, node: int, head: str, *, gpu: bool) -> list[str]:
    """``ray start --block`` for node ``node`` (the head for node 0, joining ``head`` otherwise)."""
    devices = node_devices(recipe.system)[node]
    cpus = max(len(devices), (os.cpu_count() or 1) // recipe.system.nnodes)
    host, port = head.rsplit(":", 1)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", host,
           "--num-cpus", str(cpus), "--num-gpus", str(len(devices) if gpu else 0),
           "--resources", json.dumps({NODE_RESOURCE.format(node): len(devices)}), "--disable-usage-stats"]
    if node == 0:  # nodes that are all started here need no autoscaler: no monitor process polling the head
        return cmd + ["--head", "--port", port, "--include-dashboard", "false", "--no-monitor"]
    # the nodes share this host's log directory, which the head's log monitor already sends to the driver: a second
    # monitor would send every worker line twice
    return cmd + ["--address", head, "--include-log-monitor", "false"]


def start_nodes(recipe: Recipe, run: Path, *, gpu: bool, timeout_s: float) -> RayNodes:
    """Start the head, wait for it to answer, then the other nodes; returns once they are started (the driver
    waits for them to join with :func:`wait_for_nodes` after connecting). In ``run``: the cluster's
    authentication token, which this process and every node read, and each node's log."""
    sysc = recipe.system
    host = socket.gethostbyname(sysc.master_addr)
    nodes = RayNodes(f"{host}:{sysc.master_port or free_port(host)}")
    # the nodes and this driver share a token of their own: nothing outside the probe joins or reads its cluster
    token = run / rundir.RAY_TOKEN
    token.write_text("")
    token.chmod(0o600)
    token.write_text(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token.resolve()))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    base = dict(os.environ)
    try:
        for n in range(sysc.nnodes):
            env = simulated_node_env(recipe, n, base, gpu=gpu)  # Ray hands out the GPUs its node process sees
            with open(run / rundir.RAY_NODE_LOG.format(n), "wb") as log:
                nodes.procs.append(subprocess.Popen(node_command(recipe, n, nodes.address, gpu=gpu), env=env,
                                                    stdout=log, stderr=subprocess.STDOUT))
            if n == 0:
                _wait_for_port(host, int(nodes.address.rsplit(":", 1)[1]), nodes.procs[0], timeout_s, run)
    except BaseException:
        nodes.stop()
        raise
    return nodes


def node_log_tail(run: Path, node: int) -> str:
    """The last :data:`TAIL_LINES` non-empty lines of a node's log, joined with `` | `` (empty when it wrote none)."""
    path = run / rundir.RAY_NODE_LOG.format(node)
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return " | ".join(lines[-TAIL_LINES:])


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, timeout_s: float, run: Path) -> None:
    deadline = time.monotonic() + timeout_s
    log = rundir.RAY_NODE_LOG.format(0)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Ray head on {host}:{port} exited with code {proc.returncode} while starting: "
                               f"{node_log_tail(run, 0) or '(no output)'} (all of it in {log})")
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the Ray head on {host}:{port} did not answer within system.ray_timeout_s={timeout_s:g} s "
                       f"(its output: {log})")


def wait_for_nodes(nnodes: int, timeout_s: float, run: Path) -> None:
    """Block until the connected cluster has ``nnodes`` live nodes, each with its ``nodeN`` resource; a node that
    does not join in time is reported with the end of its log."""
    import ray

    want = {NODE_RESOURCE.format(n) for n in range(nnodes)}
    deadline = time.monotonic() + timeout_s
    while True:
        have = {k for node in ray.nodes() if node.get("Alive") for k in node.get("Resources", {})}
        if want <= have:
            return
        if time.monotonic() > deadline:
            missing = [n for n in range(nnodes) if NODE_RESOURCE.format(n) not in have]
            said = "; ".join(f"node {n}: {node_log_tail(run, n) or '(no output)'}" for n in missing)
            raise RuntimeError(f"only {sorted(want & have)} of the {nnodes} simulated Ray nodes joined within "
                               f"system.ray_timeout_s={timeout_s:g} s ({said})")
        time.sleep(0.2)
