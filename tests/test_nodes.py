"""A probe whose ranks span two nodes, simulated on this host, learns what the same ranks on one node learn.

- spmd: two torchruns (``--nnodes 2``, one rank each) meeting on loopback run what one torchrun of two ranks
  runs (FSDP2 over gloo, each half of the batch sampled with seed + rank): the same curve step for step.
- single controller: a Ray head and a second Ray node, one worker of each role group on each, run what the same
  two ranks run as one torchrun on one node: the same rewards and global gradient norms step for step (that the
  single controller on one node runs what spmd runs is test_equivalence's check).
- the node layout is checked before anything is written, and each node's communication and GPUs are recorded
  under the node.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from probe_procs import ProcessWatch, probe_pids
from test_equivalence import EXACT_TOL, _max_diff
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import ROLES, load_recipe
from tunekit.config.errors import TunekitError
from tunekit.launch.preflight import preflight
from tunekit.launch.probe import run_probe
from tunekit.placement.nodes import main as nodes_main
from tunekit.placement.nodes import node_devices, node_of
from tunekit.profiler import nvml as nvml_mod
from tunekit.profiler.comm import over_ranks, per_node
from tunekit.profiler.nvml import NvmlSampler, merge_node_summaries
from tunekit.rundir import write_config
from tunekit.search.learning import compare

STEPS = 6
# GRPO without a reference: three role groups, the fewest Ray workers to start
SMALL = [f"probe.steps={STEPS}", "probe.seed=0", "probe.warmup_steps=1", "profiler.comm_steps=1", "system.device=cpu",
         "algorithm.name=grpo", "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2",
         "system.batch.micro_batch_size=4", "probe.timeout_s=500",
         "system.ray_timeout_s=180"]  # Ray nodes start slowly on a busy machine
TWO_RANKS = [f"system.device_map.{r}=[0,1]" for r in ROLES]
TWO_NODES = ["system.nnodes=2", "system.simulate_nodes=true"]
SINGLE = ["system.controller=single"]
COMPARED = ("reward/mean", "actor/pg_loss", "actor/grad_norm")
# spmd records rank 0's policy loss, the single controller the mean over its ranks: across controllers the rewards and
# the global gradient norm (reduced over both ranks) are compared
ACROSS_CONTROLLERS = ("reward/mean", "actor/grad_norm")


def _probe(tmp_path, name, sets, watch=None):
    import pandas as pd

    result = run_probe(load_recipe(None, SMALL + TWO_RANKS + sets), out=tmp_path, run_id=name, progress=watch)
    assert result.status == "ok", (name, result.summary["reason"])
    return result, pd.read_parquet(result.run_dir / "steps.parquet")


def _same_learning(one, two, keys=COMPARED) -> None:
    for key in keys:
        assert _max_diff(one, two, key, STEPS) <= EXACT_TOL, (key, _max_diff(one, two, key, STEPS))
    c = compare(one["reward/mean"].tolist(), two["reward/mean"].tolist(), window=STEPS)
    assert c["curve_diff"] <= c["curve_bound"]


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """Both ranks as one torchrun on one node: what each two-node probe must learn."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        return _probe(tmp_path_factory.mktemp("nodes"), "one_node", [])[1]


@pytest.mark.slow
def test_two_node_spmd_learns_what_one_node_learns(tmp_path, one_node):
    one = one_node
    watch = ProcessWatch(tmp_path / "two_nodes")
    result, two = _probe(tmp_path, "two_nodes", TWO_NODES, watch)
    _same_learning(one, two)
    # two torchrun launches, one per node, each with its node rank
    launches = [cmd for cmd in watch.seen.values() if "torch.distributed.run" in cmd]
    assert len(launches) == 2 and any("--node-rank 1" in c for c in launches), watch.seen
    # each node's communication on the sampled step, under its node
    sampled = two[two["comm/sampled"] == 1.0]
    assert len(sampled) == 1
    for node in (0, 1):
        assert sampled[f"comm/node{node}/wait_s/update_actor"].iloc[0] > 0
    assert "comm/node0/wait_s/update_actor" not in one.columns
    assert "USDT" not in (result.run_dir / "log.txt").read_text()  # a step was profiled: no profiler trace points
    assert probe_pids(tmp_path / "two_nodes") == {}


@pytest.mark.slow
def test_two_node_single_controller_learns_what_one_node_learns(tmp_path, one_node):
    watch = ProcessWatch(tmp_path / "two_nodes")
    result, two = _probe(tmp_path, "two_nodes", SINGLE + TWO_NODES, watch)
    _same_learning(one_node, two, ACROSS_CONTROLLERS)
    # rank r of every group ran on node r, and the two nodes are two Ray nodes
    workers = json.loads((result.run_dir / "workers.json").read_text())
    for role, infos in workers.items():
        assert [i["node"] for i in infos] == [0, 1], role
        assert infos[0]["ray_node_id"] != infos[1]["ray_node_id"], role
    assert sum("raylet" in cmd for cmd in watch.seen.values()) >= 2, watch.seen
    # the driver stopped the cluster it started: no Ray process of the probe is left
    assert probe_pids(tmp_path / "two_nodes") == {}


# ---------------------------------------------------------------- layout and checks


def test_devices_split_over_nodes_in_order():
    sysc = load_recipe(None, [f"system.device_map.{r}=[0,1,2,3]" for r in ROLES] + ["system.nnodes=2"]).system
    assert node_devices(sysc) == [[0, 1], [2, 3]]
    assert node_of(sysc) == {0: 0, 1: 0, 2: 1, 3: 1}
    single = load_recipe(None, SINGLE + ["system.nnodes=2", "system.device_map.actor=[0]", "system.device_map.critic=[0]",
                                         "system.device_map.ref=[0]", "system.device_map.rollout=[1]", "system.device_map.reward=[1]"])
    assert node_devices(single.system) == [[0], [1]]  # single: every role's devices, split roles included


def _free_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("sets, words", [
    (["system.nnodes=2"], "system.simulate_nodes=true"),
    (TWO_NODES + [f"system.device_map.{r}=[0,1,2]" for r in ROLES], "do not split evenly over system.nnodes=2"),
    (TWO_NODES + ["system.nnodes=4"], "do not split evenly over system.nnodes=4"),
    (TWO_NODES + ["system.master_addr=no-such-host.invalid"], "does not resolve"),
    (TWO_NODES + ["system.master_addr=192.0.2.123"], "is not an address of this host"),
    (TWO_NODES + SINGLE + ["system.ray_address=127.0.0.1:6379"], "unset one of them"),
    (TWO_NODES + ["runner=trl"], "runner trl launches its ranks on one node"),
    (TWO_NODES + SINGLE + ["system.rollout.backend=vllm", "system.rollout.tensor_parallel_size=2"],
     "would span two nodes"),
])
def test_bad_node_layout_is_refused(sets, words):
    recipe = load_recipe(None, SMALL + TWO_RANKS + sets)
    with pytest.raises(TunekitError) as e:
        preflight(recipe, cuda_count=0)
    assert words in e.value.message and e.value.exit_code == 2


def test_verl_runner_refuses_nodes():
    from tunekit.runners.verl_refusals import refusals

    verl = SMALL + TWO_RANKS + SINGLE + ["runner=verl", "system.rollout.backend=vllm"]
    assert any("runner verl starts its Ray cluster on one node" in r
               for r in refusals(load_recipe(None, verl + TWO_NODES), gpu=True))
    assert not any("nnodes" in r for r in refusals(load_recipe(None, verl), gpu=True))


def test_busy_master_port_is_refused_exit_2_nothing_written(tmp_path):
    with _free_port_in_use() as busy:
        port = busy.getsockname()[1]
        res = CliRunner().invoke(app, ["probe", "--out", str(tmp_path / "runs"), *sum((["--set", s] for s in
                                       SMALL + TWO_RANKS + TWO_NODES + [f"system.master_port={port}"]), [])])
    assert res.exit_code == 2, res.output
    assert f"system.master_port {port} is in use" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()


def test_each_node_gets_its_torchrun_command(tmp_path, capsys):
    recipe = load_recipe(None, [f"system.device_map.{r}=[0,1,2,3]" for r in ROLES]
                         + ["system.nnodes=2", "system.master_addr=10.0.0.1", "system.master_port=29555"])
    write_config(tmp_path, recipe)
    assert nodes_main([str(tmp_path), "--print"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for node, line in enumerate(lines):
        assert f"--nnodes 2 --node-rank {node} --nproc-per-node 2 --master-addr 10.0.0.1 --master-port 29555" in line
        assert line.endswith(f"-m tunekit.trainer.entry {tmp_path}")


# ---------------------------------------------------------------- records per node


def test_comm_per_node_is_the_mean_over_its_ranks():
    parts = [(0, {"comm/exposed_s/update_actor": 0.2, "comm/total_s/update_actor": 0.5, "comm/sampled": 1.0}),
             (0, {"comm/exposed_s/update_actor": 0.4, "comm/total_s/update_actor": 0.7, "comm/sampled": 1.0}),
             (1, {"comm/exposed_s/update_actor": 0.9, "comm/total_s/update_actor": 1.0, "comm/sampled": 1.0})]
    out = per_node(parts)
    assert out["comm/node0/exposed_s/update_actor"] == pytest.approx(0.3)
    assert out["comm/node0/total_s/update_actor"] == pytest.approx(0.6)
    assert out["comm/node1/exposed_s/update_actor"] == pytest.approx(0.9)
    assert not any("sampled" in k for k in out)
    # the group's own figure is the mean over every rank, not rank 0's: (0.2 + 0.4 + 0.9) / 3
    group = over_ranks(parts)
    assert group == {"comm/exposed_s/update_actor": pytest.approx(0.5), "comm/total_s/update_actor": pytest.approx(2.2 / 3)}


def test_nvml_records_each_gpu_under_its_node(monkeypatch):
    from test_profiler import _fake_pynvml

    monkeypatch.setattr(nvml_mod, "_import_pynvml", lambda: _fake_pynvml(energy=True))
    summaries = []
    for node in (0, 1):  # each node's first rank samples its own GPU
        with NvmlSampler([node], interval_s=0.02, nodes={node: node}) as sampler:
            time.sleep(0.06)
        assert set(sampler.to_frame()["node"]) == {node}
        summaries.append(sampler.summary())
    merged = merge_node_summaries(summaries)
    assert merged["nvml/available"] is True
    assert merged["nvml/mem_used_gb/node1.gpu1"] == 2.0 and merged["nvml/node1/mem_used_gb"] == 2.0
    assert merged["nvml/mem_used_gb/node0.gpu0"] == 1.0 and merged["nvml/node0/util_mean"] == 50.0
    assert merged["nvml/energy_j"] == merged["nvml/node0/energy_j"] + merged["nvml/node1/energy_j"]
    # one node: the GPU keys stay plain NVML indices, no node keys
    with NvmlSampler([1], interval_s=0.02) as plain:
        time.sleep(0.04)
    assert "nvml/mem_used_gb/1" in plain.summary() and not any("node" in k for k in plain.summary())


class HoldUntilNodesRun(ProcessWatch):
    """Holds the launcher in its progress call until the probe runs a raylet per node, so that a probe timeout shorter
    than the nodes' start passes while they run: the next check after the hold kills the probe."""

    def __init__(self, run_dir, nodes: int, hold_s: float = 180.0) -> None:
        super().__init__(run_dir)
        self.nodes, self.hold_s = nodes, hold_s

    def __call__(self, steps_done: int) -> None:
        deadline = time.monotonic() + self.hold_s
        while time.monotonic() < deadline:
            live = probe_pids(self.run_dir)
            self.seen |= live
            if sum("raylet" in cmd for cmd in live.values()) >= self.nodes or (self.seen and not live):
                return  # the nodes run, or the probe ended without them
            time.sleep(0.2)


@pytest.mark.slow
def test_killed_two_node_probe_leaves_no_ray_process(tmp_path):
    """A two-node probe killed by its timeout while its Ray nodes run takes both nodes with it."""
    sets = SMALL + TWO_RANKS + SINGLE + TWO_NODES + ["probe.timeout_s=1", "probe.steps=1000"]
    watch = HoldUntilNodesRun(tmp_path / "run", nodes=2)
    result = run_probe(load_recipe(None, sets), out=tmp_path, run_id="run", progress=watch)
    assert result.status == "timeout"
    # the watch saw a raylet of each node before the timeout killed the probe
    assert sum("raylet" in cmd for cmd in watch.seen.values()) >= 2, watch.seen
    assert probe_pids(tmp_path / "run") == {}


def test_a_ray_head_that_exits_while_starting_is_reported_with_the_end_of_its_log(tmp_path):
    """The head's own output reaches the probe's error: a run directory whose log is lost still says why."""
    import subprocess
    import sys

    from tunekit.trainer.ray_nodes import _wait_for_port

    with open(tmp_path / "ray-node0.log", "wb") as log:
        code = "print('starting'); print(); print('GCS could not bind its port'); raise SystemExit(1)"
        head = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError) as err:
        _wait_for_port("127.0.0.1", port, head, 30.0, tmp_path)
    msg = str(err.value)
    assert "exited with code 1" in msg and "starting | GCS could not bind its port" in msg and "ray-node0.log" in msg
