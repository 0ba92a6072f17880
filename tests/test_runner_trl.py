"""The TRL runner: tunekit's knobs in GRPOConfig's words, what TRL cannot express, and the winner as a TRL launch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tunekit.config import load_recipe
from tunekit.runners.trl import TrlRunner, grpo_args, optimizer_steps_per_step, refusals, server_args

pytest.importorskip("trl")

GRPO = ["algorithm.name=grpo", "system.batch.samples_per_prompt=4"]


def recipe(*sets, name=None):
    return load_recipe(name, [*GRPO, *sets])


def test_batch_knobs_become_trl_batch_arguments():
    r = recipe("system.batch.prompts_per_step=16", "system.batch.micro_batch_size=8", "system.batch.mini_batch_size=32",
               "algorithm.ppo_epochs=2")
    args = grpo_args(r, gpu=False)
    # 64 samples a step, 32 per optimizer step, 8 per micro-batch on one rank
    assert args["num_generations"] == 4 and args["per_device_train_batch_size"] == 8
    assert args["gradient_accumulation_steps"] == 4 and args["steps_per_generation"] == 8
    assert args["num_iterations"] == 2 and optimizer_steps_per_step(r) == 4  # 2 mini-batches x 2 epochs
    assert args["use_vllm"] is False if "use_vllm" in args else True
    assert args["bf16"] is False and args["model_init_kwargs"] == {"dtype": "float32"} and "fsdp" not in args


def test_learning_and_memory_knobs_keep_their_trl_names():
    r = recipe("algorithm.actor_lr=3e-5", "algorithm.kl_coef=0.04", "algorithm.clip_ratio=0.25",
               "algorithm.clip_ratio_high=0.28", "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
               "algorithm.entropy_coef=0.01", "task.max_new_tokens=7", "task.temperature=0.7", "task.fixed_length=true",
               "system.memory.gradient_checkpointing=true", "system.compile=true", "probe.seed=9")
    a = grpo_args(r, gpu=False)
    assert (a["learning_rate"], a["beta"], a["epsilon"], a["max_completion_length"], a["temperature"], a["seed"]) == \
        (3e-5, 0.04, 0.25, 7, 0.7, 9)
    assert (a["epsilon_high"], a["delta"], a["loss_type"], a["entropy_coef"]) == (0.28, 3.0, "dr_grpo", 0.01)
    assert grpo_args(recipe(), gpu=False)["loss_type"] == "dapo"  # token-mean over the accumulated batch
    assert a["gradient_checkpointing"] is True and a["torch_compile"] is True and a["lr_scheduler_type"] == "constant"
    assert a["generation_kwargs"] == {"min_new_tokens": 7}  # HF generate ignores EOS until the budget
    # TRL's own defaults differ (gradient checkpointing on): tunekit's value is always written
    assert grpo_args(recipe(), gpu=False)["gradient_checkpointing"] is False


def test_rollout_backends_and_gpus():
    colo = recipe("system.rollout.backend=vllm", "system.rollout.enforce_eager=false", "system.rollout.torch_compile=true",
                  "system.rollout.gpu_memory_utilization=0.3", "task.fixed_length=true")
    a = grpo_args(colo, gpu=True)
    assert (a["use_vllm"], a["vllm_mode"], a["vllm_enable_sleep_mode"], a["vllm_gpu_memory_utilization"]) == \
        (True, "colocate", True, 0.3)
    assert a["generation_kwargs"]["ignore_eos"] is True and a["bf16"] is True
    assert "fsdp" not in a and a["torch_compile"] is False  # auto on one GPU: the plain module, TRL's default compile
    fsdp = grpo_args(recipe("system.memory.fsdp_single_gpu=true"), gpu=True)
    assert fsdp["fsdp"] is True and fsdp["fsdp_config"]["reshard_after_forward"] is True
    assert grpo_args(recipe("system.memory.param_offload=true"), gpu=True)["fsdp_config"]["cpu_offload"] is True
    two = recipe("system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}",
                 "system.memory.fsdp_single_gpu=false", "system.batch.micro_batch_size=8")
    a2 = grpo_args(two, gpu=True)
    assert a2["fsdp"] is True and a2["gradient_accumulation_steps"] == 8  # 128 samples / (8 x 2 ranks)
    server = recipe("system.rollout.backend=vllm_server", "system.rollout.enforce_eager=false",
                    "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}")
    assert grpo_args(server, gpu=True)["vllm_mode"] == "server" and refusals(server, True) == []
    assert "--compilation-config" in server_args(server) and "--enforce-eager" not in server_args(server)
    url = recipe("system.rollout.backend=vllm_server", "system.rollout.server_url=http://10.0.0.2:8000",
                 "system.device_map.rollout=[]")
    assert grpo_args(url, gpu=True)["vllm_server_base_url"] == "http://10.0.0.2:8000"


@pytest.mark.parametrize("sets, key", [
    (["algorithm.name=ppo"], "algorithm.name=ppo"),
    (["system.controller=single"], "system.controller=single"),
    (["system.device_map.rollout=[1]"], "system.device_map"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k1"], "algorithm.kl_estimator=k1"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_loss=false"], "algorithm.kl_loss=false"),
    (["algorithm.clip_ratio_c=1.1"], "algorithm.clip_ratio_c=1.1"),
    (["system.rollout.backend=vllm"], "system.rollout.enforce_eager"),
    (["system.rollout.backend=vllm", "system.rollout.enforce_eager=false", "system.rollout.torch_compile=true",
      "system.rollout.sleep_level=1"], "system.rollout.sleep_level=1"),
    (["system.rollout.backend=vllm_server", "system.rollout.enforce_eager=false", "system.rollout.max_num_seqs=64",
      "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}"],
     "system.rollout.max_num_seqs"),
    (["profiler.trace=true"], "profiler.trace"),
    (["system.memory.master_weights=true"], "system.memory.master_weights=true"),
    (["system.cuda_graphs=true"], "system.cuda_graphs=true"),
    (["system.rollout.backend=vllm", "system.rollout.enforce_eager=false", "system.rollout.torch_compile=true",
      "system.rollout.logprobs=false"], "system.rollout.logprobs=false"),
    (["system.device_map={actor: [0, 1], rollout: [0, 1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}",
      "system.batch.mini_batch_size=16"], "system.batch.micro_batch_size 16"),
    (["system.rollout.backend=vllm_server", "system.rollout.enforce_eager=false",
      "system.device_map={actor: [0], rollout: [0], reward: [0], ref: [0], critic: [0]}"], "system.device_map.rollout"),
])
def test_what_trl_cannot_express_is_refused_by_name(sets, key):
    r = load_recipe(None, ["system.batch.samples_per_prompt=4", *(["algorithm.name=grpo"] if "algorithm.name=ppo" not in sets else []),
                           *sets])
    problems = refusals(r, gpu=True)
    assert problems and problems[0].startswith(key), problems
    with pytest.raises(Exception) as e:
        TrlRunner().check(r, cuda_count=4)
    assert getattr(e.value, "exit_code", None) == 2 and e.value.message.startswith(key)


def test_several_refusals_come_in_a_fixed_order_and_check_names_the_first():
    r = load_recipe(None, ["system.batch.samples_per_prompt=4", "algorithm.name=ppo", "algorithm.kl_coef=0.1",
                           "algorithm.kl_loss=false", "system.controller=single", "system.rollout.backend=vllm",
                           "system.device_map={actor: [0, 1], rollout: [1], reward: [0, 1], ref: [0, 1], critic: [0, 1]}",
                           "profiler.trace=true", "system.batch.mini_batch_size=16", "system.memory.param_offload=true"])
    keys = ["algorithm.name=ppo", "system.controller=single", "algorithm.kl_loss=false", "system.device_map",
            "system.rollout.enforce_eager / torch_compile"]
    # on GPUs two ranks split the batch; on CPU offload and several ranks are refused instead
    assert [p.split(":")[0] for p in refusals(r, gpu=True)] == [*keys, "profiler.trace", "system.batch.micro_batch_size 16"]
    assert [p.split(":")[0] for p in refusals(r, gpu=False)] == [
        *keys, "system.memory.param_offload", "profiler.trace", "system.device_map"]
    with pytest.raises(Exception) as e:
        TrlRunner().check(r, cuda_count=2)
    assert e.value.message.startswith("algorithm.name=ppo")


def test_the_default_grpo_recipe_runs_as_it_is():
    assert refusals(load_recipe("tiny-grpo"), gpu=False) == []


def test_launch_script_builds_the_trainer_it_describes(tmp_path, monkeypatch):
    """The handback script, run with TRL's ``train`` stubbed: its dataset, reward and GRPOConfig are real."""
    import sys

    import trl

    # 64 samples a step in two optimizer steps of 32: a 50-step run is 100 of TRL's steps
    r = load_recipe("tiny-grpo", ["algorithm.actor_lr=1e-4", "system.batch.mini_batch_size=32", "system.device=cpu"])
    hb = TrlRunner().handback(r, 50)
    assert hb.command == "python trl_launch.py" and set(hb.files) == {"trl_launch.py"}
    text = hb.files["trl_launch.py"]
    assert "python trl_launch.py" in text and "learning_rate=0.0001" in text
    built = {}
    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self: built.setdefault("trainer", self))
    monkeypatch.chdir(tmp_path)
    for argv, steps in ((["trl_launch.py"], 100), (["trl_launch.py", "--steps", "3"], 6)):
        monkeypatch.setattr(sys, "argv", argv)
        ns: dict = {}
        exec(compile(text, "trl_launch.py", "exec"), ns)  # noqa: S102 - the generated launch is the thing under test
        trainer = built.pop("trainer")
        args = trainer.args
        assert (args.learning_rate, args.num_generations, args.max_steps, args.gradient_checkpointing) == (1e-4, 4, steps, False)
        data = trainer.train_dataset
        assert len(data) == steps // 2 * r.system.batch.prompts_per_step
    row = data[0]
    assert ns["reward"](completions=[row["answer"], ""], tunekit_row=[0, 0]) == [1.0, 0.0]


def test_launch_script_evaluates_the_held_out_prompts_greedily_as_the_probes_did(tmp_path, monkeypatch, capsys):
    import sys

    import trl

    from tunekit.runners.trl_entry import greedy
    from tunekit.workload import build_workload

    r = load_recipe("tiny-grpo", ["system.device=cpu", "probe.eval_every=2", "task.eval_fraction=0.05",
                                  "probe.eval_prompts=6"])
    text = TrlRunner().handback(r, 4).files["trl_launch.py"]
    built, calls = {}, []
    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self: (built.setdefault("trainer", self), calls.append("train")))
    monkeypatch.setattr(trl.GRPOTrainer, "evaluate", lambda self: (calls.append(("evaluate", self.generation_config.do_sample)),
                                                                     {"eval_reward": 0.25})[1])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["trl_launch.py", "--steps", "3"])
    exec(compile(text, "trl_launch.py", "exec"), {})  # noqa: S102 - the generated launch is the thing under test
    trainer = built["trainer"]
    assert calls == [("evaluate", False), "train"]  # the untrained model's reading first, greedy, as the probes took it
    assert "before training: {'eval_reward': 0.25}" in capsys.readouterr().out  # and the user sees it
    assert "and once before training" in text
    held = [p.text for p in build_workload(r.task).eval_prompts(6)]
    assert [row[-1]["content"] if isinstance(row, list) else row for row in trainer.eval_dataset["prompt"]] == held
    train = {row[-1]["content"] if isinstance(row, list) else row for row in trainer.train_dataset["prompt"]}
    assert len(trainer.train_dataset) == 3 * r.system.batch.prompts_per_step and train.isdisjoint(held)
    assert (trainer.args.eval_strategy, trainer.args.eval_steps, trainer.args.num_generations_eval) == ("steps", 2, 1)
    # batches of at most the training micro-batch: TRL's evaluation runs the loss's forward passes over its batch too
    assert trainer.args.per_device_eval_batch_size == min(r.system.batch.micro_batch_size, len(held)) == 6
    assert type(trainer).__name__ == "GreedyEvalGRPOTrainer"  # its evaluate runs under greedy()
    sampling = trainer.generation_config
    with greedy(trainer):  # what its evaluate runs under: no sampling
        assert trainer.generation_config.do_sample is False
    assert trainer.generation_config is sampling and sampling.do_sample is True


@pytest.mark.parametrize("held, micro, ranks, batch", [(64, 8, 1, 8), (20, 16, 1, 10), (43, 8, 1, 1), (6, 64, 1, 6),
                                                        (64, 8, 2, 8), (20, 64, 2, 10)])
def test_trl_evaluates_in_batches_that_divide_the_held_out_prompts(held, micro, ranks, batch):
    """TRL's eval_reward is a mean of its batches' means: batches of one size make it the mean over the prompts; none
    larger than the training micro-batch, as TRL's evaluation runs the loss's forward passes over its batch."""
    from tunekit.runners.trl_entry import eval_args

    devices = ", ".join(map(str, range(ranks)))
    r = recipe(f"system.batch.micro_batch_size={micro}", "system.batch.mini_batch_size=64",
               *([f"system.device_map={{actor: [{devices}], rollout: [{devices}], reward: [{devices}], ref: [{devices}], "
                  f"critic: [{devices}]}}", "system.device=cuda"] if ranks > 1 else []))
    assert eval_args(r, 1, held)["per_device_eval_batch_size"] == batch


def test_a_launch_gives_vllm_the_context_the_probes_gave_it(tmp_path):
    """Without it TRL's engine takes the model's longest context and reserves its cache for that, where the probes'
    engine held room for a prompt and the response only."""
    import json

    from tunekit.config.base import PROMPT_TOKEN_BUDGET

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    colo = recipe("system.device=cuda", "system.rollout.backend=vllm", f"model.path={tmp_path}", "task.max_new_tokens=32")
    text = TrlRunner().handback(colo, 10).files["trl_launch.py"]
    assert f"vllm_max_model_length={PROMPT_TOKEN_BUDGET + 32}," in text
    short = recipe("system.device=cuda", "system.rollout.backend=vllm", f"model.path={tmp_path}", "task.max_new_tokens=8000")
    assert "vllm_max_model_length=8192," in TrlRunner().handback(short, 10).files["trl_launch.py"]  # the model's own limit
    server = recipe("system.device=cuda", "system.rollout.backend=vllm_server", f"model.path={tmp_path}",
                    "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}")
    text = TrlRunner().handback(server, 10).files["trl_launch.py"]
    assert f"--max-model-len {PROMPT_TOKEN_BUDGET + 4} " in text and "vllm_max_model_length" not in text


def test_the_handed_back_line_of_a_server_run_starts_the_server_and_stops_it(tmp_path):
    """Run as printed (with stand-ins for ``trl`` and ``python``): the server starts on the rollout GPU in the
    background, training runs while it is up, the server is stopped after, and the line's status is training's."""
    import os
    import stat
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {"trl": 'echo "$CUDA_VISIBLE_DEVICES $*"; echo $$ > server.pid; exec sleep 60',
             "python": 'sleep 0.5; kill -0 "$(cat server.pid)" && echo "trained on $CUDA_VISIBLE_DEVICES: $*" > trained.txt; exit 3'}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    server = recipe("system.device=cuda", "system.rollout.backend=vllm_server",
                    "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}")
    line = TrlRunner().handback(server, 10).command
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, timeout=30)
    assert done.returncode == 3  # training's status
    assert (tmp_path / "trained.txt").read_text() == "trained on 0: trl_launch.py\n"
    assert (tmp_path / "trl-vllm-serve.log").read_text().startswith("1 vllm-serve --model ")
    pid = int((tmp_path / "server.pid").read_text())
    for _ in range(50):  # the server was stopped (and reaped by its shell)
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the server is still running")


def test_a_server_run_stopped_by_ctrl_c_stops_its_server_too(tmp_path):
    """Ctrl-C reaches the line's whole process group, but a background job of a shell ignores SIGINT: the server
    would outlive the run and hold its GPUs, were it not stopped on the way out."""
    import os
    import signal
    import stat
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {"trl": "echo $$ > server.pid; exec sleep 60", "python": "touch training; sleep 30"}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    server = recipe("system.device=cuda", "system.rollout.backend=vllm_server",
                    "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    line = subprocess.Popen(["bash", "-c", TrlRunner().handback(server, 10).command], cwd=tmp_path, env=env,
                            start_new_session=True)
    for _ in range(100):
        if (tmp_path / "server.pid").exists() and (tmp_path / "training").exists():
            break
        time.sleep(0.1)
    os.killpg(line.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
    assert line.wait(timeout=30) != 0
    pid = int((tmp_path / "server.pid").read_text())
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the server outlived the stopped run")


def test_launch_line_on_gpus(monkeypatch):
    for var in ("CUDA_VISIBLE_DEVICES", "TUNEKIT_LAUNCH_GPUS"):
        monkeypatch.delenv(var, raising=False)
    r = recipe("system.device=cuda", "system.memory.fsdp_single_gpu=false", "system.batch.micro_batch_size=8",
               "system.device_map={actor: [2, 3], rollout: [2, 3], reward: [2, 3], ref: [2, 3], critic: [2, 3]}")
    hb = TrlRunner().handback(r, 10)
    assert hb.command == "CUDA_VISIBLE_DEVICES=2,3 accelerate launch --num_processes 2 trl_launch.py"
    text = hb.files["trl_launch.py"]
    assert "fsdp=True" in text and "bf16=True" in text and "gradient_accumulation_steps=8" in text
    compile(text, "trl_launch.py", "exec")
    one = recipe("system.device=cuda", "system.memory.fsdp_single_gpu=true",
                 "system.device_map={actor: [1], rollout: [1], reward: [1], ref: [1], critic: [1]}")
    assert TrlRunner().handback(one, 10).command == "CUDA_VISIBLE_DEVICES=1 accelerate launch --num_processes 1 trl_launch.py"
    plain = recipe("system.device=cuda")  # auto: the plain module on one GPU
    assert TrlRunner().handback(plain, 10).command == "CUDA_VISIBLE_DEVICES=0 python trl_launch.py"


def test_launch_script_reads_the_users_dataset_and_verl_style_reward(tmp_path, monkeypatch):
    import sys

    import trl

    (tmp_path / "rows.jsonl").write_text("".join(f'{{"q": "{i}+1", "a": {i + 1}, "data_source": "s{i % 2}"}}\n' for i in range(8)))
    (tmp_path / "verl_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    assert isinstance(solution_str, str) and data_source in ('s0', 's1')\n"
        "    return {'score': float(solution_str.strip() == ground_truth), 'source': data_source}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    r = recipe("task.dataset=rows.jsonl", "task.prompt_column=q", "task.answer_column=a", "system.batch.prompts_per_step=8",
               "task.prompt_template={q}=", "task.reward=verl_reward:compute_score", "system.device=cpu")
    text = TrlRunner().handback(r, 5).files["trl_launch.py"]
    built = {}
    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self: built.setdefault("trainer", self))
    monkeypatch.setattr(sys, "argv", ["trl_launch.py", "--steps", "1"])
    ns: dict = {}
    try:
        exec(compile(text, "trl_launch.py", "exec"), ns)  # noqa: S102 - the generated launch is the thing under test
    finally:
        sys.modules.pop("verl_reward", None)
    data = built["trainer"].train_dataset
    assert sorted(data["prompt"]) == sorted(f"{i}+1=" for i in range(8))
    first = data[0]
    n = int(first["prompt"].split("+")[0])
    assert first["answer"] == str(n + 1)
    # a conversational completion is scored as its text
    done = [f" {n + 1}", [{"role": "assistant", "content": str(n + 1)}], "2"]
    assert ns["reward"](completions=done, tunekit_row=[0, 0, 0]) == [1.0, 1.0, 0.0]


def test_a_probe_runs_the_recipes_steps_in_trls_and_keeps_nothing(tmp_path, monkeypatch):
    from tunekit.runners.trl_entry import SERVER_ENV, probe_grpo_args

    # 64 samples a step in two optimizer steps of 32: 5 probe steps are 10 of TRL's
    r = recipe("system.batch.prompts_per_step=16", "system.batch.mini_batch_size=32", "probe.steps=5")
    monkeypatch.delenv(SERVER_ENV, raising=False)
    a = probe_grpo_args(r, tmp_path / "run", tmp_path, gpu=False, per_step=2)
    assert a["max_steps"] == 10 and a["logging_steps"] == 2 and a["learning_rate"] == r.algorithm.actor_lr
    assert (a["report_to"], a["save_strategy"], a["shuffle_dataset"], a["use_cpu"]) == ("none", "no", False, True)
    assert a["output_dir"].startswith(str(tmp_path / "run"))
    assert "vllm_max_model_length" not in a and "vllm_server_base_url" not in a  # hf: the policy generates
    # the colocated engine holds a 512-token prompt and the response, within the model's 520 positions
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 520}')
    colo = recipe("system.rollout.backend=vllm", "task.max_new_tokens=16")
    assert probe_grpo_args(colo, tmp_path / "run", tmp_path, gpu=True, per_step=1)["vllm_max_model_length"] == 520
    monkeypatch.setenv(SERVER_ENV, "http://127.0.0.1:8001 29555")
    server = probe_grpo_args(r, tmp_path / "run", tmp_path, gpu=True, per_step=2)
    assert (server["vllm_server_base_url"], server["vllm_group_port"]) == ("http://127.0.0.1:8001", 29555)


@pytest.mark.parametrize("gpus, backend, launched", [
    ("[0]", "vllm", False), ("[0]", "hf", False), ("[0, 1]", "vllm", True)])
def test_one_trainer_gpu_trains_in_the_first_process_as_torchruns_only_rank(tmp_path, monkeypatch, gpus, backend, launched):
    """One trainer GPU: the first process is the rank, in the environment torchrun gives a single rank (TRL's
    colocated engine reads it); more: torchrun starts one rank per GPU with the same additions."""
    import os
    import subprocess

    from tunekit import rundir
    from tunekit.runners import trl_entry

    r = recipe("system.device=cuda", f"system.rollout.backend={backend}",
               f"system.device_map={{actor: {gpus}, rollout: {gpus}, reward: {gpus}, ref: {gpus}, critic: {gpus}}}")
    monkeypatch.setattr(rundir, "read_config", lambda run: r)
    monkeypatch.setattr(trl_entry, "on_gpu", lambda device: True)
    monkeypatch.setattr(trl_entry, "prepare_model", lambda recipe, tmp, gpu: tmp)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()  # this test's process keeps its own
                                        if k not in ("RANK", trl_entry.WORKER_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING")})
    seen = {}
    monkeypatch.setattr(trl_entry, "train", lambda run, prepared_s: seen.update(env=dict(os.environ), prepared_s=prepared_s) or 0)
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: seen.update(cmd=cmd, env=env) or 0)
    assert trl_entry.main(str(tmp_path)) == 0
    env = seen["env"]
    assert ("cmd" in seen) == launched and env[trl_entry.WORKER_ENV] == "1"
    assert env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == ("0" if backend == "vllm" else None)
    if launched:
        cmd = seen["cmd"]
        assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and "RANK" not in env
    else:
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "0", "1", "127.0.0.1")
        assert int(env["MASTER_PORT"]) > 0 and seen["prepared_s"] >= 0  # its start-up part "prepare"
