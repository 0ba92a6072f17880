"""Bad device maps and Ray addresses fail with one clear sentence, before or within a bounded time."""

from __future__ import annotations

import importlib.util
import socket
import time

import pytest
from probe_procs import probe_pids

from tunekit.config import ROLES, load_recipe
from tunekit.config.errors import ConfigError
from tunekit.launch.preflight import preflight
from tunekit.launch.probe import run_probe

SINGLE = ["system.controller=single", "system.device=cpu"]


def test_gpu_index_past_the_machine():
    split = [f"system.device_map.{r}=[0]" for r in ("actor", "critic", "ref", "reward")] + ["system.device_map.rollout=[3]"]
    r = load_recipe(None, ["system.controller=single", "system.device=cuda"] + split)
    with pytest.raises(ConfigError, match=r"names GPU 3 but this machine has 2 GPU\(s\)"):
        preflight(r, cuda_count=2)


def test_missing_role():
    # a whole map that leaves out roles PPO needs
    r = load_recipe(None, SINGLE + ["system.device_map={actor: [0], rollout: [0], reward: [0]}"])
    with pytest.raises(ConfigError, match=r"system.device_map.critic is missing|system.device_map.ref is missing"):
        preflight(r, cuda_count=0)


def test_group_that_does_not_split_the_batch():
    r = load_recipe(None, SINGLE + [f"system.device_map.{r}=[0]" for r in ROLES] + ["system.device_map.actor=[0,1,2]"])
    with pytest.raises(ConfigError, match=r"device_map.actor has 3 devices, which does not divide the step's 32 samples"):
        preflight(r, cuda_count=0)


def test_split_roles_need_the_single_controller():
    r = load_recipe(None, ["system.device=cpu"] + [f"system.device_map.{r}=[0]" for r in ROLES] + ["system.device_map.rollout=[1]"])
    with pytest.raises(ConfigError, match="controller spmd colocates every role"):
        preflight(r, cuda_count=0)


def test_collective_sync_between_processes_on_one_gpu():
    r = load_recipe(None, ["system.controller=single", "system.device=cuda", "system.weight_sync=collective"])
    with pytest.raises(ConfigError, match="NCCL cannot broadcast between two processes on one GPU"):
        preflight(r, cuda_count=2)


def test_ray_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs Ray, which is not installed; run `pip install"):
        preflight(load_recipe(None, SINGLE), cuda_count=0)


def test_ray_address_that_refuses(tmp_path):
    r = load_recipe(None, SINGLE + ["system.ray_address=127.0.0.1:1"])
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"system.ray_address 127.0.0.1:1: nothing answers there"):
        run_probe(r, out=tmp_path)
    assert time.monotonic() - t0 < 10
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.slow
def test_ray_address_that_never_answers(tmp_path):
    """A port that accepts connections but is no Ray head: the driver gives up after system.ray_timeout_s."""
    with socket.socket() as silent:
        silent.bind(("0.0.0.0", 0))
        silent.listen()
        port = silent.getsockname()[1]
        r = load_recipe(None, SINGLE + [f"system.ray_address=127.0.0.1:{port}", "system.ray_timeout_s=5",
                                        "probe.timeout_s=120"])
        t0 = time.monotonic()
        result = run_probe(r, out=tmp_path, run_id="run")
    assert result.status == "failed"
    assert f"system.ray_address=127.0.0.1:{port} did not answer within system.ray_timeout_s=5 s" in result.summary["reason"]
    assert time.monotonic() - t0 < 60
    assert probe_pids(tmp_path / "run") == {}
