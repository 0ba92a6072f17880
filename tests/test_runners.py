"""The runner seam: the recipe's ``runner`` key, the builtin runner's process tree and its handback."""

from __future__ import annotations

import shlex
import typing

from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import RolloutConfig, RunnerName, load_recipe
from tunekit.runners import RUNNERS, runner_for

TWO_RANKS = "system.device_map={actor:[0,1],critic:[0,1],ref:[0,1],rollout:[0,1],reward:[0,1]}"


def test_every_runner_a_recipe_may_name_is_in_the_map():
    assert set(typing.get_args(RunnerName)) == set(RUNNERS)
    assert all(cls.name == name for name, cls in RUNNERS.items())


def test_builtin_process_tree_follows_controller_and_ranks(tmp_path):
    one = load_recipe(None)
    two = load_recipe(None, [TWO_RANKS])
    single = load_recipe(None, ["system.controller=single"])
    cmd = {name: runner_for(r).command(r, tmp_path) for name, r in (("one", one), ("two", two), ("single", single))}
    assert cmd["one"][-3:] == ["-m", "tunekit.trainer.entry", str(tmp_path)] and "torch.distributed.run" not in cmd["one"]
    assert "torch.distributed.run" in cmd["two"] and cmd["two"][cmd["two"].index("--nproc-per-node") + 1] == "2"
    assert cmd["single"][-3:] == ["-m", "tunekit.trainer.driver", str(tmp_path)]


def test_builtin_env_tags_the_probe_and_keeps_cpu_ranks_single_threaded(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    r = load_recipe(None)
    env = runner_for(r).env(r, tmp_path, on_gpu=False)
    assert env["TUNEKIT_RUN_DIR"] == str(tmp_path.resolve()) and env["OMP_NUM_THREADS"] == "1"


def test_builtin_handback_is_a_full_length_probe_of_the_same_recipe(tmp_path):
    r = load_recipe(None, ["system.batch.micro_batch_size=4", "algorithm.name=grpo", "system.batch.samples_per_prompt=4"])
    hb = runner_for(r).handback(r, 250)
    argv = shlex.split(hb.command)
    assert argv[:2] == ["tunekit", "probe"] and argv[argv.index("--steps") + 1] == "250"
    (name, text), = hb.files.items()
    assert argv[argv.index("--recipe") + 1] == name
    (tmp_path / name).write_text(text)
    back = load_recipe(str(tmp_path / name))
    assert back.probe.steps == 250 and back.probe.save_policy  # the full run keeps what it trained
    same = back.model_copy(update={"probe": back.probe.model_copy(update={"steps": r.probe.steps, "save_policy": False})})
    assert same.model_dump() == r.model_dump()


def test_runner_flag_is_a_recipe_key_and_an_unknown_one_is_exit_2(tmp_path):
    res = CliRunner().invoke(app, ["probe", "--runner", "nope", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "runner" in res.output
    assert not list(tmp_path.iterdir())


def test_each_backend_declares_where_it_runs():
    from tunekit.placement.backends import BACKENDS, trainer_devices
    from tunekit.trainer.rollout import ENGINES

    assert set(BACKENDS) == set(ENGINES) == set(typing.get_args(typing.get_type_hints(RolloutConfig)["backend"]))
    split = "system.device_map={actor:[0],ref:[0],critic:[0],reward:[0],rollout:[1]}"
    for name, spec in BACKENDS.items():
        assert spec.name == name
        r = load_recipe(None, [f"system.rollout.backend={name}", split, "system.controller=single"])
        # a backend inside the trainer's ranks puts its GPUs among theirs; a server's GPUs run no rank
        assert trainer_devices(r.system) == ([0, 1] if spec.in_trainer_ranks else [0])
    served = load_recipe(None, ["system.rollout.backend=vllm_server", "system.rollout.server_url=http://127.0.0.1:9"]).system.rollout
    assert not BACKENDS["vllm_server"].needs_checkpoint(served) and BACKENDS["vllm"].needs_checkpoint(served)
