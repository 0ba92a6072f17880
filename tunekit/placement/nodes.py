"""Nodes: how a probe's devices split over machines, and launching each node's ranks.

``system.nnodes`` nodes hold the devices in order, the same number each (:func:`node_devices`): under spmd the
trainer's GPUs (one torchrun per node, ``--nnodes`` / ``--node-rank``, meeting at ``system.master_addr``), under
the single controller every role's (one Ray node per machine, its workers placed through a ``nodeN`` resource:
:mod:`tunekit.trainer.ray_nodes`).

``python -m tunekit.placement.nodes RUN_DIR`` is the spmd probe's root process when nodes are simulated: it starts every
node's torchrun on this host, each seeing only its own GPUs, and ends them all when one fails. On real machines
``python -m tunekit.placement.nodes RUN_DIR --node-rank N`` runs node N's torchrun there (``--print`` shows it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from tunekit.config import Recipe, SystemConfig
from tunekit.config.errors import ConfigError
from tunekit.placement.gpus import nvml_indices, on_gpu, visible_devices
from tunekit.placement.backends import backend_of, trainer_devices
from tunekit.placement.ports import free_port, port_is_free

NODE_RESOURCE = "node{}"
"""The Ray custom resource that names node N (one unit per device slot on it)."""


def spread_devices(sysc: SystemConfig) -> list[int]:
    """The devices that split over the nodes: the trainer's under spmd, every role's under single."""
    return trainer_devices(sysc) if sysc.controller == "spmd" else sysc.devices


def node_devices(sysc: SystemConfig) -> list[list[int]]:
    """The devices of each node, node 0 first: consecutive equal slices of :func:`spread_devices`."""
    devices = spread_devices(sysc) or [0]
    per = max(1, len(devices) // sysc.nnodes)
    return [devices[n * per:(n + 1) * per] for n in range(sysc.nnodes)]


def node_of(sysc: SystemConfig) -> dict[int, int]:
    """Device index -> the node that holds it."""
    return {d: n for n, devs in enumerate(node_devices(sysc)) for d in devs}


def node_gpus(sysc: SystemConfig, node: int) -> tuple[list[int], dict[int, int]]:
    """NVML indices of node ``node``'s GPUs, as that node sees them, and each one's node (for its sampler).

    Simulated nodes are this host's GPUs that the device map names; a real node's are its own first ones."""
    devices = node_devices(sysc)[node]
    gpus = nvml_indices(devices if sysc.simulate_nodes else range(len(devices)))
    return gpus, {g: node for g in gpus}


def check_nodes(recipe: Recipe) -> None:
    """Refuse a node layout this host cannot launch (one sentence naming the key, exit 2)."""
    sysc = recipe.system
    if sysc.nnodes == 1:
        return
    if not sysc.simulate_nodes:
        raise ConfigError(f"system.nnodes is {sysc.nnodes} but a probe launches on this host only; set system.simulate_nodes=true to run every node here, or on real machines run `python -m tunekit.placement.nodes RUN_DIR --node-rank N` on each node.")
    devices = spread_devices(sysc)
    what = "trainer devices" if sysc.controller == "spmd" else "devices"
    if len(devices) % sysc.nnodes:
        raise ConfigError(f"system.device_map holds {len(devices)} {what}, which do not split evenly over system.nnodes={sysc.nnodes}; give nnodes x (devices per node) of them.")
    if backend_of(sysc.rollout).served_by_url and not sysc.rollout.server_url:
        raise ConfigError("system.rollout.backend=vllm_server starts its server on one node; with system.nnodes > 1 use hf or vllm, or give system.rollout.server_url.")
    nodes = node_of(sysc)
    for replica in sysc.rollout_replicas if sysc.rollout.tensor_parallel_size > 1 else []:
        if len({nodes.get(d) for d in replica}) > 1:
            raise ConfigError(f"system.rollout.tensor_parallel_size {sysc.rollout.tensor_parallel_size}: the rollout replica on devices {replica} would span two nodes; give each node whole replicas (devices per node a multiple of it).")
    if sysc.ray_address:
        raise ConfigError(f"system.simulate_nodes starts its own Ray cluster but system.ray_address is {sysc.ray_address!r}; unset one of them.")
    check_master(sysc)


def check_master(sysc: SystemConfig) -> None:
    """``master_addr`` resolves to an address of this host, and ``master_port``, if given, is free there."""
    try:
        addr = socket.gethostbyname(sysc.master_addr)
    except OSError:
        raise ConfigError(f"system.master_addr {sysc.master_addr!r} does not resolve; give an address of this host, e.g. 127.0.0.1.") from None
    try:
        free_port(addr)
    except OSError:
        raise ConfigError(f"system.master_addr {sysc.master_addr!r} ({addr}) is not an address of this host, where simulated nodes meet; use 127.0.0.1.") from None
    if sysc.master_port is not None and not port_is_free(addr, sysc.master_port):
        raise ConfigError(f"system.master_port {sysc.master_port} is in use on {addr}; pick a free port or unset it for a free one.")


def torchrun_command(recipe: Recipe, run_dir: Path, node: int, port: int) -> list[str]:
    """Node ``node``'s torchrun: its ranks of the spmd probe, meeting the others at ``master_addr:port``."""
    sysc = recipe.system
    per = len(node_devices(sysc)[node])
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(sysc.nnodes), "--node-rank", str(node),
            "--nproc-per-node", str(per), "--master-addr", sysc.master_addr, "--master-port", str(port),
            "-m", "tunekit.trainer.entry", str(run_dir)]


def simulated_node_env(recipe: Recipe, node: int, env: dict[str, str], *, gpu: bool) -> dict[str, str]:
    """The environment of a node simulated on this host: only its own GPUs visible, and with
    ``simulate_network`` its own NCCL host id."""
    out = dict(env)
    if gpu:
        out["CUDA_VISIBLE_DEVICES"] = visible_devices(node_devices(recipe.system)[node], env)
    if recipe.system.simulate_network:
        out["NCCL_HOSTID"] = f"tunekit-node{node}"
    return out


def run_nodes(recipe: Recipe, run_dir: Path, *, gpu: bool) -> int:
    """Every node's torchrun on this host; the first failure ends the others. Returns the worst exit code."""
    port = recipe.system.master_port or free_port(socket.gethostbyname(recipe.system.master_addr))
    procs = [subprocess.Popen(torchrun_command(recipe, run_dir, n, port),
                              env=simulated_node_env(recipe, n, dict(os.environ), gpu=gpu))
             for n in range(recipe.system.nnodes)]
    while any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs):
            break  # a node failed: the others would wait on its ranks until their timeout
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return max((p.returncode for p in procs), key=abs)


def main(argv: list[str] | None = None) -> int:
    from tunekit.rundir import read_config

    parser = argparse.ArgumentParser(prog="python -m tunekit.placement.nodes", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory holding the probe's config.yaml")
    parser.add_argument("--node-rank", type=int, help="run only this node's torchrun (on a real machine)")
    parser.add_argument("--print", action="store_true", help="print the torchrun command(s) instead of running them")
    args = parser.parse_args(argv)
    recipe = read_config(args.run_dir)
    sysc = recipe.system
    if args.node_rank is None and not args.print:
        return run_nodes(recipe, args.run_dir, gpu=on_gpu(sysc.device))
    if args.node_rank is not None and not 0 <= args.node_rank < sysc.nnodes:
        parser.error(f"--node-rank {args.node_rank} is not a node of system.nnodes={sysc.nnodes}")
    if sysc.master_port is None and sysc.nnodes > 1:
        parser.error("every node must meet at one port: set system.master_port in the recipe")
    port = sysc.master_port or free_port()
    nodes = range(sysc.nnodes) if args.node_rank is None else [args.node_rank]
    commands = [torchrun_command(recipe, args.run_dir, n, port) for n in nodes]
    if args.print:
        print("\n".join(shlex.join(c) for c in commands))
        return 0
    return subprocess.call(commands[0])


if __name__ == "__main__":
    sys.exit(main())
