"""A verl probe's first process: ``python -m tunekit.runners.verl_entry RUN_DIR``.

It writes the checkpoint verl loads (a preset's seeded random weights, as for TRL, with a tokenizer verl's agent
loop accepts: :func:`tunekit.runners.model_dir.prepare_model`), the workload as verl's parquet
files (:mod:`tunekit.runners.verl_data`), renders the first prompts through verl's own tokenization
(:func:`verl_renders_prompts`), then runs ``python -m verl.trainer.main_ppo`` with the recipe's
overrides (:func:`tunekit.runners.verl.probe_args`) in its own working directory (``RUN_DIR/verl/``, removed at the
end). verl's output goes to this process's output (``log.txt``); its file logger's step lines (kept as
``verl-steps.jsonl``) become tunekit's rows in ``steps.jsonl`` as they come (:mod:`tunekit.runners.verl_records`),
so the launcher sees progress and a hang. The GPUs are sampled with NVML meanwhile, as the other runners do. Where
the start-up went (tunekit's preparation, then verl's own stages, read off the lines it prints as they arrive:
:mod:`tunekit.runners.verl_startup`) goes into the result as ``startup/<part>_s``.
"""

from __future__ import annotations

import collections
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.profiler.nvml import probe_summary, save_samples
from tunekit.profiler.phases import steady_summary
from tunekit.profiler.startup import StartupClock
from tunekit.rundir import EvalSampleLog, SampleLog, StepLog
from tunekit.runners.verl_startup import SPAWNED, StartupLines
from tunekit.workload.reward import RewardError

_STARTED = time.time()  # this process's start of work
POLL_S = 0.5
CHECKED_PROMPTS = 8
"""Prompts rendered through verl's own tokenization before verl starts (:func:`verl_renders_prompts`)."""
TAIL_LINES = 40
GENERATIONS = "generations"
"""Where in verl's working directory it dumps each step's rollouts, the source of the probe's samples.parquet."""
VALIDATIONS = "validations"
"""Where in verl's working directory it dumps each validation's responses, the source of eval_samples.parquet."""


def main(run_dir: str) -> int:
    run = Path(run_dir).resolve()  # verl runs in its own working directory: every path it is given is absolute
    tmp = Path(tempfile.mkdtemp(prefix="tunekit-verl-"))
    work = rundir.framework_dir(run, "verl")
    try:
        recipe = rundir.read_config(run)
        return train(recipe, run, tmp, work)
    except Exception as e:  # noqa: BLE001 - a failure before verl starts is the probe's outcome too
        return record_error(run, f"{type(e).__name__}: {e}", traceback.format_exc().splitlines()[-15:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def train(recipe: Recipe, run: Path, tmp: Path, work: Path) -> int:
    from tunekit.runners.model_dir import check_prompt_ids, prepare_model
    from tunekit.runners.verl import ENTRY, FILE_LOGGER_ENV, probe_args
    from tunekit.runners.verl_data import prompt_texts, write_data
    from tunekit.runners.verl_records import MetricsFile

    startup = StartupClock(_STARTED)
    with startup.part("prepare"):  # tunekit's own work before verl starts
        model = prepare_model(recipe, tmp, gpu=True, chat_rollout=True)
        data_dir = tmp / "data"
        texts = prompt_texts(write_data(recipe, data_dir, recipe.probe.steps))
        check_prompt_ids(recipe, model, texts)
        verl_renders_prompts(recipe, model, texts[:CHECKED_PROMPTS])
    work.mkdir(parents=True, exist_ok=True)
    metrics_path = rundir.framework_steps(run, "verl")
    generations = work / GENERATIONS if recipe.probe.samples_per_step else None
    validations = work / VALIDATIONS if recipe.evaluates else None
    cmd = [sys.executable, "-m", ENTRY, *probe_args(recipe, model=model, data_dir=data_dir, generations=generations,
                                                    validations=validations)]
    print("verl:", " ".join(cmd), flush=True)
    # PYTHONUNBUFFERED: verl's driver writes its lines (and Ray's relay of its workers') into the pipe as they come,
    # so each arrives when it was written (:mod:`tunekit.runners.verl_startup` times the start-up by them)
    env = dict(os.environ, **{FILE_LOGGER_ENV: str(metrics_path), "PYTHONUNBUFFERED": "1"})
    records = Records(recipe, StepLog(run), MetricsFile(metrics_path), samples=SampleLog(run, recipe.probe),
                      generations=generations, validations=validations, eval_samples=EvalSampleLog(run), startup=startup)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with nvml_sampler(recipe) as nvml:
        records.lines.mark(SPAWNED)
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        relay = threading.Thread(target=_relay, args=(proc.stdout, tail, records), daemon=True)
        relay.start()
        while proc.poll() is None:
            records.poll()
            time.sleep(POLL_S)
        relay.join(timeout=10)
        records.finish()
    records.log.flush()
    save_samples(nvml, rundir.nvml_path(run))
    if proc.returncode != 0 or len(records.rows) < recipe.probe.steps:
        if records.reward_error:  # the user's reward failed inside verl's workers: its sentence is the reason
            rundir.write_error(run, 0, {"status": "failed", "message": records.reward_error})
            return 1
        why = f"verl exited with code {proc.returncode} after {len(records.rows)} of {recipe.probe.steps} steps"
        return record_error(run, why, list(tail))
    rundir.write_result(run, records.result() | probe_summary(nvml))
    return 0


def verl_renders_prompts(recipe: Recipe, model: Path, texts: list[str]) -> None:
    """The first prompts through verl's own agent-loop tokenization before verl starts: its model config (with the
    chat template the runner gives it) and the continuous-token builder it picks for the checkpoint's model type. verl's Ray
    workers, FSDP and vLLM server take minutes to start before its agent loop first tokenizes; a tokenizer it
    refuses, or a prompt it renders to other ids than tunekit's loop feeds, is the probe's error in a second here.
    Skipped (with a line saying so) where this verl has no such code."""
    try:
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder
        from verl.workers.config.model import HFModelConfig
    except ImportError as e:
        print(f"verl's prompt tokenization not checked before launch ({e})", flush=True)
        return
    from tunekit.config.errors import ConfigError
    from tunekit.runners.verl import AR, chat_template
    from tunekit.trainer import build
    from tunekit.trainer.batch import encode_prompts
    from tunekit.workload.chat import prompt_format

    template = chat_template(recipe).get(f"{AR}.model.custom_chat_template")
    config = HFModelConfig(path=str(model), custom_chat_template=template)
    ours = build.load_tokenizer(recipe)
    fmt = prompt_format(recipe.task, ours)
    try:
        builder = create_continuous_token_builder(config.tokenizer, hf_model_type=config.hf_config.model_type)
        for text in texts:
            ids = builder.build_initial_tokens(fmt.messages(text))
            want = encode_prompts(ours, [fmt.render(ours, text)])["prompt_ids"][0].tolist()
            if list(ids) != want:
                raise ValueError(f"it renders the prompt {text!r} to {list(ids)[:12]}, tunekit's loop feeds {want[:12]}")
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"verl's agent loop would refuse the checkpoint in {model}: {e}; set model.tokenizer_path "
                          "to a tokenizer verl accepts for this model type") from None


def reward_error(line: str) -> str | None:
    """The sentence of a :class:`tunekit.workload.RewardError` a verl worker's traceback ends with, or None."""
    _, found, sentence = line.partition(f"{RewardError.__name__}: ")
    return sentence.strip() if found and sentence.startswith("task.reward") else None


def _relay(stream: IO[bytes], tail: collections.deque[str], records: Records) -> None:
    """verl's output to this process's (the run's log.txt), keeping its last lines for an error record, its
    start-up milestones with their times (:mod:`tunekit.runners.verl_startup`), and passing its console logger's
    step lines on."""
    from tunekit.runners.verl_records import DUMPED, parse_console_line

    for raw in iter(stream.readline, b""):
        arrived = time.time()
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        records.lines.see(line, arrived)
        if (sentence := reward_error(line)) is not None:
            records.reward_error = records.reward_error or sentence
        if (parsed := parse_console_line(line)) is not None:
            records.console.put(parsed)
        if (dumped := DUMPED.search(line)) is not None:
            records.dumped.add(dumped.group(1))


class Records:
    """verl's step lines, as they arrive, appended to the run's step log under tunekit's names. The file logger's
    lines are read first; the console logger's (the same numbers, relayed from verl's output) stand in for a
    step the file has not given, e.g. when the file logger's path did not reach verl's trainer process."""

    def __init__(self, recipe: Recipe, log: StepLog, source, *, samples: SampleLog | None = None,
                 generations: Path | None = None, validations: Path | None = None,
                 eval_samples: EvalSampleLog | None = None, startup: StartupClock | None = None) -> None:
        """``generations``: where verl dumps each step's rollouts (``trainer.rollout_data_dir``); the steps
        ``samples`` keeps are read from there as their rows arrive, and every dump is removed once read.
        ``validations``: where verl dumps each validation's responses (``trainer.validation_data_dir``), read into
        ``eval_samples`` once whole. ``startup``: the clock that timed the probe's preparation (default a fresh one)."""
        self.recipe, self.log, self.source = recipe, log, source
        self.samples, self.generations = samples, generations
        self.validations, self.eval_samples = validations, eval_samples
        self.console: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.startup = startup if startup is not None else StartupClock(_STARTED)
        """verl's start-up to its first step, read off its first step line (:mod:`tunekit.profiler.startup`)."""
        self.lines = StartupLines()
        """verl's start-up milestones, from its output (:mod:`tunekit.runners.verl_startup`): its parts."""
        self.reward_error: str | None = None
        """The user's reward's failure sentence, when verl's output reported one."""
        self.dumped: set[str] = set()
        """The dumps verl has said are whole (their paths as it printed them), from its output."""
        self._unread: list[int] = []
        """Steps (from 1) whose row has arrived and whose dump of rollouts is not read yet."""
        self._last = 0

    @property
    def rows(self) -> list[dict[str, float]]:
        return self.log.rows

    def poll(self) -> None:
        from tunekit.runners.verl_records import eval_reward, step_row

        lines = self.source.read()
        while not self.console.empty():
            lines.append(self.console.get())
        for step, metrics in sorted(lines, key=lambda line: line[0]):
            if step == 0 and (before := eval_reward(metrics)) is not None:  # the validation before training
                self.startup.evaluated_before(before)
            row = step_row(step, metrics, self.recipe.system.batch.samples_per_step)
            if row is None or step <= self._last:  # not a training step, or one the other logger gave
                continue
            self._last = step
            first = self.startup.first_ready is None
            if first:  # the first step began its timing_s/step before its line arrived
                self.startup.steps_begin(at=max(time.time() - row["timing_s/step"], self.startup.started))
            self.log.append(row)
            if first:
                self._record_parts()
                self.startup.first_step_done(row)
            self._unread.append(step)
        self._keep_samples(finished=False)
        self._keep_validations(finished=False)

    def finish(self) -> None:
        """After verl's process has ended: the last lines, and every dump it left (its writes are over)."""
        self.poll()
        self._keep_samples(finished=True)
        self._keep_validations(finished=True)

    def _whole(self, dump: Path, finished: bool) -> bool:
        """Whether verl's dump ``dump`` can be read: verl said it is whole, or (``finished``) it writes no more."""
        return finished or str(dump) in self.dumped

    @staticmethod
    def _take(dump: Path, wanted: bool) -> tuple | None:
        """verl's dump ``dump`` as (prompts, responses, answers, rewards) where ``wanted``, then gone; None unwanted, or
        for a dump cut short when verl was stopped."""
        from tunekit.runners.verl_records import read_generations

        try:
            return read_generations(dump) if wanted else None
        except (ValueError, KeyError):
            return None
        finally:
            dump.unlink()

    def _keep_validations(self, *, finished: bool) -> None:
        """verl's dumps of its validations (``<steps trained>.jsonl``) into the evaluation's samples, each once
        whole, then gone."""
        if self.validations is None or not self.validations.is_dir():
            return
        dumps = sorted((p for p in self.validations.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
        for dump in (d for d in dumps if self._whole(d, finished)):
            if (answers := self._take(dump, self.eval_samples is not None)) is not None:
                self.eval_samples.add(int(dump.stem), *answers)

    def _record_parts(self) -> None:
        """verl's start-up parts read off its lines so far into the clock."""
        for part, seconds in self.lines.parts(self.startup.first_ready).items():
            self.startup.record(part, seconds)

    def _keep_samples(self, *, finished: bool) -> None:
        """verl's dumps of the steps whose rows have arrived into the samples, each once verl has said it is whole
        (or, ``finished``, whatever it left), then gone; a step verl dumped nothing for has no samples."""
        if self.generations is None:
            self._unread.clear()
            return
        for step in list(self._unread):
            dump = self.generations / f"{step}.jsonl"
            if not self._whole(dump, finished):
                continue  # verl's background writer has not finished it
            self._unread.remove(step)
            wanted = self.samples is not None and self.samples.wants(step - 1)
            if dump.exists() and (rows := self._take(dump, wanted)) is not None:
                self.samples.add(step - 1, *rows)

    def result(self) -> dict[str, Any]:
        """What the launcher merges into ``summary.json``."""
        warm = min(self.recipe.probe.warmup_steps, max(len(self.rows) - 1, 0))
        steady = steady_summary(self.rows, warm) if self.rows else {}
        self._record_parts()
        return self.startup.summary(self.rows, steady) | {
            "steady": steady, "steady_from_step": warm, "runner/version": verl_version(),
            "comm/method": "not measured (runner verl: verl's collectives run inside its Ray workers)"}


def verl_version() -> str:
    try:
        return version("verl")
    except PackageNotFoundError:
        return "unknown"


def record_error(run: Path, message: str, tail: list[str]) -> int:
    text = "\n".join([message, *tail])
    oom = "out of memory" in text.lower() or "OutOfMemoryError" in text
    rundir.write_error(run, 0, {"status": "oom" if oom else "failed", "message": message[:500], "traceback": tail[-15:]})
    return 3 if oom else 1


def nvml_sampler(recipe: Recipe):
    from tunekit.placement.gpus import nvml_indices
    from tunekit.profiler.nvml import NvmlSampler

    return NvmlSampler(nvml_indices(recipe.system.devices), interval_s=recipe.profiler.nvml_interval_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
