"""A TRL probe's processes: ``python -m tunekit.runners.trl_entry RUN_DIR``.

The first process prepares the checkpoint TRL loads (a preset's seeded random weights are written once), starts
``trl vllm-serve`` on the rollout GPUs when the recipe's backend is ``vllm_server`` without a URL, and runs the
training ranks: itself on CPU and on one trainer GPU (in the environment torchrun gives a single rank, without
torchrun's and the rank's own interpreter start and imports), one per trainer GPU under torchrun on more. Each rank
runs TRL's ``GRPOTrainer`` with the arguments of :func:`tunekit.runners.trl.grpo_args`; rank 0 writes tunekit's
records.

A probe step is one generation batch (TRL's ``steps_per_generation x num_iterations`` micro-steps). Its phases,
each synchronised with the GPU at both edges:

- ``timing_s/gen``: TRL's ``_generate`` without the weight push: tokenizing the prompts, generating (HF
  ``generate``, or waking the vLLM KV cache, generating and sleeping again; a server's HTTP round trip), decoding.
- ``timing_s/update_weights``: TRL's ``vllm_generation.sync_weights``, run before the step's generation: wake the
  engine's weights and load the policy's into it (a server: the NCCL push). 0 with ``hf``: the policy generates.
- ``timing_s/reward``: ``task.reward`` over the step's completions.
- ``timing_s/old_logprob``: the rest of ``_generate_and_score_completions``: the old policy's logprobs (when TRL
  needs them), the reference's (``beta > 0``), the group advantages and the gathers across ranks.
- ``timing_s/update_actor``: the rest of the step: forward and backward of every micro-batch, gradient clipping,
  the optimizer steps.
- ``timing_s/step``: from the step's first ``on_step_begin`` to its last ``on_step_end`` (TRL's callbacks).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.placement.gpus import on_gpu
from tunekit.config.errors import error_record
from tunekit.profiler.nvml import probe_summary, save_samples
from tunekit.rundir import StepLog
from tunekit.runners.model_dir import prepare_model

WORKER_ENV = "TUNEKIT_TRL_WORKER"
MODEL_ENV = "TUNEKIT_TRL_MODEL_DIR"
SERVER_ENV = "TUNEKIT_TRL_SERVER"
_STARTED = time.time()  # this process's start of work: what StartupClock measures its parts from


# ---------------------------------------------------------------- the probe's first process


def main(run_dir: str) -> int:
    run = Path(run_dir)
    if os.environ.get(WORKER_ENV):
        return train(run)
    recipe = rundir.read_config(run)
    gpu = on_gpu(recipe.system.device)
    tmp = Path(tempfile.mkdtemp(prefix="tunekit-trl-"))
    server = None
    try:
        began = time.perf_counter()
        os.environ[MODEL_ENV] = str(prepare_model(recipe, tmp, gpu))
        if recipe.system.rollout.backend == "vllm_server" and not recipe.system.rollout.server_url:
            server = start_server(recipe, run, Path(os.environ[MODEL_ENV]))
            os.environ[SERVER_ENV] = f"{server.url} {server.group_port}"
        prepared_s = time.perf_counter() - began  # a rank in this process records it; a torchrun rank counts it in its launch
        if not gpu:
            return train(run, prepared_s)
        from tunekit.placement.ports import free_port
        from tunekit.runners.trl import ranks

        port = free_port()
        if ranks(recipe, gpu) == 1:  # one rank: this process, in the environment torchrun gives its only rank
            os.environ.update(rank_env(recipe), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            return train(run, prepared_s)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks(recipe, gpu)),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "tunekit.runners.trl_entry", str(run)]
        return subprocess.call(cmd, env=dict(os.environ, **rank_env(recipe)))
    except Exception as e:  # noqa: BLE001 - a failure before the ranks start is the probe's outcome too
        return record_error(run, 0, e)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def rank_env(recipe: Recipe) -> dict[str, str]:
    """What a training rank's environment adds to the first process's: the worker mark, and vLLM's engine core in
    the rank's own process when TRL colocates the engine (an explicit setting of the user's is kept)."""
    env = {WORKER_ENV: "1"}
    if recipe.system.rollout.backend == "vllm":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def start_server(recipe: Recipe, run: Path, model_dir: Path):
    """``trl vllm-serve`` on the rollout GPUs, healthy before the ranks start; stopped by the caller."""
    from tunekit.placement.gpus import visible_devices
    from tunekit.placement.ports import free_port
    from tunekit.runners.trl import server_args
    from tunekit.trainer.rollout.checkpoint import max_model_len
    from tunekit.trainer.rollout.server_process import ServerProcess

    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from trl.cli.main import main; sys.exit(main())", "vllm-serve",
           "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len(model_dir, recipe.task.max_new_tokens)), *server_args(recipe)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible_devices(recipe.system.device_map["rollout"]))
    log_path, pgid_path = rundir.server_files(run, "vllm-server")
    server = ServerProcess(cmd, url=f"http://127.0.0.1:{port}", log_path=log_path, pgid_path=pgid_path, env=env)
    server.start(timeout_s=recipe.system.rollout.server_timeout_s)
    server.group_port = free_port()
    return server


# ---------------------------------------------------------------- one training rank


def train(run: Path, prepared_s: float | None = None) -> int:
    """One training rank. ``prepared_s``: the seconds this process spent preparing the checkpoint (and starting a
    server) before it, when the first process is the rank (its start-up part ``prepare``)."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        recipe = rundir.read_config(run)
        trainer, records = build_trainer(recipe, run, rank, prepared_s)
        nvml = nvml_sampler(recipe) if records.log is not None else None
        with nvml if nvml is not None else contextlib.nullcontext():
            if recipe.evaluates and recipe.probe.eval_before_train:
                records.evaluate_before(trainer.evaluate)
            trainer.train()
        if nvml is not None:
            save_samples(nvml, rundir.nvml_path(run))
        if records.log is not None:
            records.log.flush()
            rundir.write_result(run, records.result() | probe_summary(nvml))
        return 0
    except Exception as e:  # noqa: BLE001 - any failure is a recorded outcome
        return record_error(run, rank, e)
    finally:
        shutil.rmtree(rundir.framework_dir(run, "trl"), ignore_errors=True)  # TRL's output_dir: nothing is saved in a probe


def record_error(run: Path, rank: int, e: BaseException) -> int:
    record = error_record(e, traceback.format_exc().splitlines())
    rundir.write_error(run, rank, record)
    return 3 if record["status"] == "oom" else 1


def nvml_sampler(recipe: Recipe):
    if not on_gpu(recipe.system.device):
        return None
    from tunekit.placement.gpus import nvml_indices
    from tunekit.profiler.nvml import NvmlSampler

    return NvmlSampler(nvml_indices(recipe.system.devices), interval_s=recipe.profiler.nvml_interval_s)


ROW_COLUMN = "tunekit_row"
"""The dataset column TRL hands the reward back: the prompt's position in the step-ordered prompts."""


def grpo_workload(task, *, per_step: int, steps: int, seed: int, tokenizer, eval_prompts: int = 0
                  ) -> tuple[dict[str, list], Callable]:
    """``task``'s workload in TRL's terms: the dataset's columns (the prompts tunekit's own loop samples at each of
    ``steps`` steps, in step order: TRL reads them unshuffled; conversations where ``task.chat_template`` puts them
    through ``tokenizer``'s chat template, which TRL then applies itself) and the reward function TRL calls, which
    scores each completion as text with ``task.reward`` (the row's prompt text, ``data_source`` and ``extra_info``
    included). With ``eval_prompts``, the held-out prompts (at most that many) follow the training rows: the rows
    past ``per_step x steps`` are the evaluation's."""
    from tunekit.workload import build_workload
    from tunekit.workload.chat import prompt_format
    from tunekit.workload.reward import extra_sums, merge_extra

    workload, fmt = build_workload(task), prompt_format(task, tokenizer)
    prompts = workload.probe_prompts(per_step, steps, seed) + workload.eval_prompts(eval_prompts)
    rows = {"prompt": [fmt.row(p.text) for p in prompts], "answer": [p.answer for p in prompts], ROW_COLUMN: list(range(len(prompts)))}

    def reward(completions, **columns) -> list[float]:
        scores = workload.scores([prompts[i] for i in columns[ROW_COLUMN]], [completion_text(c) for c in completions])
        reward.extra = merge_extra([reward.extra, extra_sums(scores)])
        return [s.value for s in scores]

    reward.__name__ = task.reward.rpartition(":")[2]  # TRL logs rewards/<name>/mean
    reward.extra = {}  # what the dict returns gave beside their scores since it was last emptied (sum, count per key)
    return rows, reward


def prompt_text(prompt) -> str:
    """A TRL prompt as the row's text: a conversation's last turn (the user's; a system turn before it is left out)."""
    return str(prompt[-1].get("content") or "") if isinstance(prompt, list) and prompt else str(prompt)


def completion_text(completion) -> str:
    """A TRL completion as the reward's string: a conversational one (a list of messages) is its messages' text."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") if isinstance(m, dict) else str(m) for m in completion)
    return str(completion)


def probe_grpo_args(recipe: Recipe, run: Path, model_dir: Path, *, gpu: bool, per_step: int) -> dict[str, Any]:
    """GRPOConfig's arguments for a probe: the recipe's (:func:`tunekit.runners.trl.grpo_args`), then the probe's
    steps in TRL's (``per_step`` each), a log line per probe step (TRL averages the metrics of its optimizer steps
    into it; a log at every optimizer step would wait for the GPU at each, where TRL's own default waits every 10th),
    nothing saved or reported, the prompts in order, and the colocated engine's context or the address of the server
    this probe started."""
    from tunekit.runners.trl import grpo_args
    from tunekit.trainer.rollout.checkpoint import max_model_len

    args = grpo_args(recipe, gpu=gpu) | {
        "output_dir": str(rundir.framework_dir(run, "trl")), "max_steps": recipe.probe.steps * per_step, "logging_steps": per_step,
        "report_to": "none", "save_strategy": "no", "disable_tqdm": True, "shuffle_dataset": False, "use_cpu": not gpu}
    if recipe.system.rollout.backend == "vllm":
        args["vllm_max_model_length"] = max_model_len(model_dir, recipe.task.max_new_tokens)
    if os.environ.get(SERVER_ENV):
        url, group_port = os.environ[SERVER_ENV].split()
        args |= {"vllm_server_base_url": url, "vllm_group_port": int(group_port)}
    return args


@contextlib.contextmanager
def greedy(trainer):
    """A GRPOTrainer's generation made greedy while the block runs, as tunekit's evaluations are (vLLM at
    temperature 0, HF ``generate`` without sampling); put back afterwards."""
    engine = getattr(trainer, "vllm_generation", None)
    saved = (engine.temperature, None) if engine is not None else (None, trainer.generation_config)
    if engine is not None:
        engine.temperature = 0.0
    else:
        trainer.generation_config = copy.deepcopy(saved[1])
        trainer.generation_config.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None)
    try:
        yield
    finally:
        if engine is not None:
            engine.temperature = saved[0]
        else:
            trainer.generation_config = saved[1]


def greedy_eval_trainer():
    """TRL's GRPOTrainer whose evaluation is greedy (:func:`greedy`), as a probe's is: the class a handed-back TRL
    launch trains with when the probes evaluated."""
    from trl import GRPOTrainer

    class GreedyEvalGRPOTrainer(GRPOTrainer):
        def evaluate(self, *a, **kw):
            with greedy(self):
                return super().evaluate(*a, **kw)

    return GreedyEvalGRPOTrainer


def eval_args(recipe: Recipe, per_step: int, held_out: int) -> dict[str, Any]:
    """GRPOConfig's evaluation arguments for ``probe.eval_every``: TRL evaluates after every that many probe steps
    (``per_step`` optimizer steps each), one response per held-out prompt, the ``held_out`` prompts split over the
    ranks in batches of at most the training micro-batch (TRL's evaluation runs the loss's forward passes over its
    batch too, so a larger one could run out of memory where training does not): the largest such size that divides
    a rank's share, so that TRL's ``eval_reward``, a mean of its batches' means, is the mean over the prompts."""
    ranks, micro = max(1, recipe.system.world_size), recipe.system.batch.micro_batch_size
    share = -(-held_out // ranks)
    batch = max([d for d in range(1, min(micro, share) + 1) if share % d == 0], default=1)
    return {"eval_strategy": "steps", "eval_steps": recipe.probe.eval_every * per_step, "num_generations_eval": 1,
            "per_device_eval_batch_size": batch}


def build_trainer(recipe: Recipe, run: Path, rank: int, prepared_s: float | None = None):
    from tunekit.profiler.startup import StartupClock

    startup = StartupClock(_STARTED)
    if prepared_s is not None:
        startup.record("prepare", prepared_s)
    with startup.part("imports"):  # TRL's trainer (which imports vLLM where it is installed) and datasets
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from tunekit.runners.trl import optimizer_steps_per_step
        from tunekit.runners.trl_records import PhaseClock, StepRecords
        from tunekit.trainer.build import load_tokenizer

    gpu = on_gpu(recipe.system.device)
    clock = PhaseClock(torch.cuda.synchronize if gpu else None)
    model_dir = Path(os.environ[MODEL_ENV])
    per_step = optimizer_steps_per_step(recipe)
    args = probe_grpo_args(recipe, run, model_dir, gpu=gpu, per_step=per_step)

    with startup.part("setup"):  # the tokenizer and the workload
        tokenizer = load_tokenizer(recipe)
        p = recipe.probe
        trained = recipe.system.batch.prompts_per_step * p.steps
        rows, score = grpo_workload(recipe.task, per_step=recipe.system.batch.prompts_per_step, steps=p.steps,
                                    seed=p.seed, tokenizer=tokenizer, eval_prompts=p.eval_prompts if p.eval_every else 0)
        data = Dataset.from_dict(rows)
        train = data.select(range(trained))
        held = data.select(range(trained, len(data))) if len(data) > trained else None
    if held is not None:
        args |= eval_args(recipe, per_step, len(held))
    samples = rundir.SampleLog(run, recipe.probe) if rank == 0 else None

    @functools.wraps(score)
    def reward(*a, **kw):
        kept = score.extra
        with clock.phase("reward"):
            scores = score(*a, **kw)
        def texts():
            return [prompt_text(p) for p in kw["prompts"]], [completion_text(c) for c in kw["completions"]], kw["answer"]

        if records.evaluating:  # this rank's share of an evaluation: no step's reward/extra, every answer kept
            score.extra = kept
            records.answers += zip(kw[ROW_COLUMN], *texts(), scores)
        elif samples is not None:  # this rank's share of a probe step's generation batch
            samples.add(records.step, *texts(), scores)
        return scores

    def take_extra() -> dict[str, tuple[float, int]]:
        taken, score.extra = score.extra, {}
        return taken

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with its generation and scoring timed (TRL's own timers do not synchronise the GPU)."""

        def _generate_and_score_completions(self, inputs):
            with clock.phase("prepare"):
                return super()._generate_and_score_completions(inputs)

        def _generate(self, prompts):
            with clock.phase("generate"):
                return super()._generate(prompts)

        def evaluate(self, *a, **kw):
            """TRL's evaluation on the held-out prompts, greedy (:func:`greedy`), its answers from every rank
            recorded (:meth:`~tunekit.runners.trl_records.StepRecords.evaluated`)."""
            from accelerate.utils import gather_object

            records.evaluating, records.answers = True, []
            try:
                with greedy(self):
                    out = super().evaluate(*a, **kw)
            finally:
                records.evaluating = False
            answers = list(records.answers)
            records.evaluated(gather_object(answers) if self.accelerator.num_processes > 1 else answers)
            return out

    records = StepRecords(recipe, clock, log=StepLog(run) if rank == 0 else None, per_step=per_step, gpu=gpu,
                          startup=startup, rank=rank, reward_extra=take_extra)
    with startup.part("framework_init"):  # TRL's trainer: its models loaded, a colocated engine started
        trainer = TimedGRPOTrainer(model=str(model_dir), reward_funcs=reward, args=GRPOConfig(**args),
                                   train_dataset=train, eval_dataset=held, processing_class=tokenizer,
                                   callbacks=[records])
    if getattr(trainer, "vllm_generation", None) is not None:
        trainer.vllm_generation.sync_weights = clock.wrap("update_weights", trainer.vllm_generation.sync_weights)
    return trainer, records


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
