"""TRL's steps as tunekit's records: a phase clock around TRL's methods and a ``TrainerCallback`` that writes one
row per probe step with tunekit's metric names (what each phase includes: :mod:`tunekit.runners.trl_entry`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainerCallback

from tunekit import metrics
from tunekit.config import Recipe
from tunekit.metrics import GIB
from tunekit.profiler.phases import steady_summary
from tunekit.profiler.startup import StartupClock
from tunekit.rundir import EvalSampleLog, StepLog
from tunekit.trainer.faults import fault_for, maybe_inject
from tunekit.workload.reward import extra_means


TRL_METRICS = {"reward": metrics.REWARD_MEAN, "completions/mean_length": metrics.RESPONSE_LENGTH_MEAN,
               "entropy": "actor/entropy", "kl": metrics.REF_KL, "loss": "actor/loss", "grad_norm": "actor/grad_norm",
               "clip_ratio/region_mean": "actor/pg_clipfrac",
               "reward_std": "reward/std", "frac_reward_zero_std": "reward/frac_zero_std",
               # vLLM's sampling logprobs vs the policy's recomputed ones: the on-policy check
               "sampling/sampling_logp_difference/mean": metrics.LOGPROB_DIFF}
"""TRL's logged names -> tunekit's (:mod:`tunekit.metrics`); TRL's others are not recorded. ``reward`` is the mean
over all ranks; ``loss`` is the whole loss (KL and entropy terms included). ``grad_norm`` is the probe step's last
optimizer step's (transformers logs the norm of the step it logs at), not a mean over them. TRL's ``policy_loss`` is
not ``actor/pg_loss``: it is logged only with an entropy term, holds the KL term, and under the ``dapo`` loss is
divided by the gradient-accumulation steps."""
EVAL_RUNTIME = "eval_runtime"
"""transformers' seconds of that evaluation: ``eval/time_s``."""


class PhaseClock:
    """Seconds per named phase, added up until :meth:`take`; ``sync`` (the GPU's) runs at both edges."""

    def __init__(self, sync: Callable[[], None] | None) -> None:
        self.sync = sync or (lambda: None)
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def phase_times(raw: dict[str, float], step_s: float) -> dict[str, float]:
    """tunekit's ``timing_s/*`` from the clock's nested totals (prepare ⊃ generate ⊃ update_weights; reward)."""
    weights = raw.get("update_weights", 0.0)
    gen = raw.get("generate", 0.0) - weights
    reward = raw.get("reward", 0.0)
    prepare = raw.get("prepare", 0.0)
    return {"timing_s/gen": gen, "timing_s/update_weights": weights, "timing_s/reward": reward,
            "timing_s/old_logprob": max(prepare - gen - weights - reward, 0.0),
            "timing_s/update_actor": max(step_s - prepare, 0.0), "timing_s/step": step_s}


class StepRecords(TrainerCallback):
    """Groups TRL's optimizer steps into probe steps (``per_step`` each) and, on rank 0, appends one row per
    probe step to ``log``; :meth:`result` is the probe's ``result.json`` (startup, steady medians)."""

    def __init__(self, recipe: Recipe, clock: PhaseClock, *, log: StepLog | None, per_step: int, gpu: bool,
                 startup: StartupClock, rank: int = 0, reward_extra: Callable[[], dict[str, tuple[float, int]]] | None = None) -> None:
        self.recipe, self.clock, self.log, self.per_step, self.gpu = recipe, clock, log, per_step, gpu
        self.reward_extra = reward_extra
        """Takes what this rank's reward dicts gave beside their scores since the last call (``reward/extra/*``)."""
        self.startup, self.rank = startup, rank
        """Times the start-up to the first step and reads the first step (:mod:`tunekit.profiler.startup`)."""
        self.fault = fault_for(recipe)
        self.rows: list[dict[str, float]] = []
        self._begun = self._ended = 0
        self._start: float | None = None
        self._step_s = 0.0
        self._tokens0 = self._tokens = 0
        self._logs: list[dict[str, Any]] = []
        self.evaluating = False
        """True while TRL evaluates on the held-out prompts (its reward calls are no step's)."""
        self.answers: list[tuple[int, str, str, str | None, float]] = []
        """This rank's answers of the evaluation running: (row, prompt, response, answer, reward)."""
        self.eval_samples = EvalSampleLog(log.run_dir) if log is not None else None
        self._pending: dict[str, float] | None = None

    @property
    def step(self) -> int:
        return len(self.rows)

    def evaluate_before(self, evaluate: Callable[[], Any]) -> None:
        """TRL's evaluation (``evaluate``: the trainer's) before its first step, inside the start-up
        (``startup/eval_before_s``): the untrained model's ``eval/reward_before`` (:meth:`evaluated`)."""
        with self.startup.part("eval_before"):
            evaluate()

    def evaluated(self, answers: list[tuple[int, str, str, str | None, float]]) -> None:
        """An evaluation's answers from every rank: each held-out row once (accelerate pads a rank's last batch
        with repeats), their mean reward the step's ``eval/reward_mean`` (before the first step:
        ``eval/reward_before``), every answer kept in eval_samples.parquet. TRL's own ``eval_reward`` is a mean of
        its batches' means, which weighs a short last batch's prompts more."""
        once = sorted({a[0]: a for a in answers}.values())  # in the held-out prompts' order, as the other runners
        mean = sum(a[4] for a in once) / len(once) if once else None
        if self.eval_samples is not None and once:
            self.eval_samples.add(self.step, *zip(*(a[1:] for a in once)))
        if not self.rows:
            self.startup.evaluated_before(mean)
        elif self._pending is not None:
            if mean is not None:
                self._pending[metrics.EVAL_REWARD_MEAN] = mean
            self._write(self._pending)
            self._pending = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._begun % self.per_step == 0:
            maybe_inject(self.fault, step=self.step, rank=self.rank, world=max(args.world_size, 1))
            self.clock.sync()
            if not self.rows and self.startup.first_ready is None:
                self.startup.steps_begin()
            if self.gpu:
                torch.cuda.reset_peak_memory_stats()
            self.clock.take()  # anything timed between steps is not the step's
            self._start, self._tokens0, self._logs = time.perf_counter(), state.num_input_tokens_seen, []
        self._begun += 1

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_evaluate and state.global_step % args.eval_steps:
            control.should_evaluate = False  # transformers' evaluation at the end of training: no probe step's
        self._ended += 1
        if self._ended % self.per_step == 0:
            self.clock.sync()
            self._step_s = time.perf_counter() - self._start
            self._tokens = state.num_input_tokens_seen - self._tokens0

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if self.evaluating:  # the evaluation's log: its seconds; its reward is the answers' (:meth:`evaluated`)
            if self._pending is not None and isinstance(logs.get(EVAL_RUNTIME), (int, float)):
                self._pending[metrics.EVAL_TIME_S] = float(logs[EVAL_RUNTIME])
            return
        self._logs.append(logs)
        # the step's last optimizer step has logged (TRL's closing train summary is not a step)
        if self._ended == self._begun and self._ended // self.per_step > len(self.rows):
            self._finish_step()

    def _finish_step(self) -> None:
        row: dict[str, float] = {"step": float(self.step)}
        row |= phase_times(self.clock.take(), self._step_s)
        row |= self._trl_metrics()
        if self.reward_extra is not None:
            row |= extra_means([self.reward_extra()])
        row["perf/total_tokens"] = float(self._tokens)
        if "response_length/mean" in row and row["timing_s/gen"] > 0:
            samples = self.recipe.system.batch.samples_per_step
            row["rollout/tokens_per_s"] = row["response_length/mean"] * samples / row["timing_s/gen"]
        if self.gpu:
            row["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / GIB
            row["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / GIB
        self.rows.append(row)
        if len(self.rows) == 1:
            self.startup.first_step_done(row if self.log is not None else None)
        every = self.recipe.probe.eval_every
        if self.recipe.evaluates and len(self.rows) % every == 0:
            self._pending = row  # TRL evaluates next: the row is written with its reward (:meth:`evaluated`)
        else:
            self._write(row)

    def _write(self, row: dict[str, float]) -> None:
        if self.log is not None:
            self.log.append(row)

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:  # an evaluation that logged no reward: the step is recorded without it
            self._write(self._pending)
            self._pending = None

    def _trl_metrics(self) -> dict[str, float]:
        """The step's TRL logs under tunekit's names (:data:`TRL_METRICS`), each the mean over the step's logs."""
        out: dict[str, float] = {}
        for key, name in TRL_METRICS.items():
            vals = [float(lg[key]) for lg in self._logs if isinstance(lg.get(key), (int, float))]
            if vals:
                out[name] = statistics.fmean(vals)
        return out

    def result(self) -> dict[str, Any]:
        """What the launcher merges into ``summary.json``."""
        import trl

        warm = min(self.recipe.probe.warmup_steps, max(len(self.rows) - 1, 0))
        steady = steady_summary(self.rows, warm) if self.rows else {}
        return self.startup.summary(self.rows, steady) | {"steady": steady, "steady_from_step": warm,
                "runner/version": trl.__version__,
                "comm/method": "not measured (runner trl: TRL's collectives run inside accelerate)"}
