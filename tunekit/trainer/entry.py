"""Entry point of one spmd rank: ``python -m tunekit.trainer.entry RUN_DIR`` (under torchrun for > 1 rank).

Reads the resolved recipe from ``RUN_DIR/config.yaml``, runs the loop and writes
``steps.parquet`` and ``result.json`` (rank 0). A failure writes ``error-rank<R>.json``
with its kind (oom / failed) so the launcher can record it; the launcher writes
``summary.json``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import tunekit
from tunekit import metrics, rundir
from tunekit.config import Recipe
from tunekit.profiler.phases import steady_summary
from tunekit.profiler.startup import StartupClock, compile_time_table
from tunekit.config.errors import error_record
from tunekit.rundir import EvalSampleLog, SampleLog, StepLog, read_config, write_error, write_result
from tunekit.trainer.faults import fault_for, maybe_inject
from tunekit.trainer.heap import freeze_after_warmup
from tunekit.trainer.save_policy import gathered, write_policy
from tunekit.placement.dist import Dist, init_from_env, leave_group


def run_steps(recipe: Recipe, trainer, log: StepLog | None, dist: Dist, clock: StartupClock, *,
              inject: Callable[[int], None] | None = None) -> dict:
    """The probe's steps; returns the result rank 0 records (steady medians, and the start-up and first step as
    ``clock`` reads them: :mod:`tunekit.profiler.startup`).

    ``inject(step)`` injects the test fault (:mod:`tunekit.trainer.faults`); default: in this rank (a
    single-controller driver injects it into a worker instead). With ``probe.eval_before_train`` the held-out
    prompts are evaluated first, inside the start-up (``startup/eval_before_s``, ``eval/reward_before``).
    """
    if recipe.evaluates and recipe.probe.eval_before_train:
        with clock.part("eval_before"):
            before = trainer.evaluation(0)
        clock.evaluated_before(before.get(metrics.EVAL_REWARD_MEAN))
    clock.steps_begin()
    fault = fault_for(recipe)
    rows = []
    for step in range(recipe.probe.steps):
        if inject is None:
            maybe_inject(fault, step=step, rank=dist.rank, world=dist.world)
        else:
            inject(step)
        row = trainer.step(step)
        if step == 0:
            clock.first_step_done(row if log is not None else None)
        row |= trainer.evaluate(step)  # outside the step's time: the probe's own measurement
        freeze_after_warmup(step + 1, recipe.probe.warmup_steps)
        rows.append(row)
        if log is not None:
            log.append(row)
            if step % 10 == 9:
                log.flush()
    if log is not None:
        log.flush()
    # a probe shorter than its warm-up still gets a summary, over every step, and says so
    warm = min(recipe.probe.warmup_steps, len(rows) - 1)
    steady = steady_summary(rows, warm)
    if table := compile_time_table():
        print(table, file=sys.stderr, flush=True)
    return clock.summary(rows, steady) | {"steady": steady, "steady_from_step": warm,
                                          metrics.RUNNER_VERSION: tunekit.__version__}


def main(run_dir: str) -> int:
    clock = StartupClock()
    run = Path(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    faulthandler.enable()  # a fatal signal prints this rank's Python stack to the log (tunekit.launch.failure)
    try:
        with clock.part("imports"):
            from tunekit.placement.nodes import node_gpus
            from tunekit.profiler.session import ProfilerSession
            from tunekit.trainer.build import build_local_roles, build_task, load_tokenizer
            from tunekit.trainer.loop import Trainer
            from tunekit.workload.models import import_model_code

            import_model_code()

        with clock.part("setup"):  # the process group, the tokenizer and the workload
            recipe = read_config(run)
            dist = init_from_env(recipe.system.device)
            tokenizer, task = load_tokenizer(recipe), build_task(recipe)
        roles = build_local_roles(recipe, dist, tokenizer, task, run_dir=run, clock=clock)
        gpus, nodes = node_gpus(recipe.system, dist.node) if dist.nnodes > 1 else (None, None)
        with ProfilerSession(recipe, run, dist, gpus=gpus, nodes=nodes) as prof:
            trainer = Trainer(recipe, roles, tokenizer=tokenizer, task=task, dist=dist, timer=prof.timer,
                              samples=SampleLog(run, recipe.probe) if dist.is_main else None,
                              eval_samples=EvalSampleLog(run) if dist.is_main else None)
            result = run_steps(recipe, trainer, StepLog(run) if dist.is_main else None, dist, clock)
        if recipe.probe.save_policy:  # every rank joins the gathers; rank 0 writes
            state = gathered(recipe, roles.actor.named_full_params(), dist)
            if dist.is_main:
                result[rundir.POLICY] = str(write_policy(recipe, state, tokenizer, run))
        if dist.is_main:
            write_result(run, result | prof.summary())
        dist.barrier()
        leave_group()
        return 0
    except torch.OutOfMemoryError as e:
        write_error(run, rank, {"status": "oom", "message": str(e).splitlines()[0][:500]})
        return 3
    except Exception as e:  # noqa: BLE001 - any failure is a recorded outcome
        record = error_record(e, traceback.format_exc().splitlines())
        write_error(run, rank, record)
        return 3 if record["status"] == "oom" else 1


if __name__ == "__main__":
    rc = main(sys.argv[1])
    if rc == 0:
        sys.stdout.flush()
        sys.stderr.flush()
        # every record is written and closed by now: skip the interpreter's teardown of torch's and transformers'
        # modules, a second or two of every rank's exit. A failed rank keeps that exit: when it failed because a peer
        # died (its connection reset), torchrun must see the peer's death first to name it the root cause
        # (tunekit.launch.failure)
        os._exit(rc)
    sys.exit(rc)
