"""The run directory ``runs/<id>/``: every file a probe writes, its writers and readers, and the statuses.

These files are the contract between a probe's processes, the launcher and everything that reads a probe
(cost, search, estimate, report); nobody else spells their names. Who writes what:

=================  ==========================================================================================
file               written by, and what it holds
=================  ==========================================================================================
config.yaml        the launcher, before the probe starts: the fully resolved recipe
steps.jsonl        rank 0 (or the driver), one line per step as it finishes: progress, and what a killed
                   probe leaves
steps.parquet      rank 0 (or the driver): the same rows, every 10 steps and at the end
samples.parquet    rank 0 (or the driver, or a framework's reward call): what the model said, a few responses of
                   the first and last five steps and every tenth (step, prompt, response, answer, reward)
eval_samples.      the same writers, with evaluation on: every greedy response of each evaluation on the held-out
parquet            prompts (trained_steps, prompt, response, answer, reward; trained_steps 0: before the first
                   step)
startup.json       rank 0 (or the driver), when the first step is done: its start-up, the compile counters and
                   cache verdict so far, the first step's time; what a probe stopped before its result.json says
                   of its start
result.json        rank 0 (or the driver), when the steps are done: startup, steady medians, profiler summary
error-rank<R>.json a rank (or the driver) that failed: its status (oom / failed) and message
nvml.parquet       the NVML sampler on the main rank (GPU probes)
log.txt            the launcher: every process's output
log-first-         the launcher, where the shared compile cache failed a probe's first attempt and it ran again
attempt.txt        cold in a private one: the first attempt's output
summary.json       the launcher: ``running`` while the probe runs, then its status, reason, cost and medians
ray.json,          the single-controller driver: its Ray cluster and where each role worker runs
workers.json
traces/rank<R>/    the profiler, with ``profiler.trace``: torch.profiler traces of the sampled steps
<name>.log,        a server a probe started: its output, and its process group (removed when it stops)
<name>.pgid
<runner>/          a runner's framework output during the probe (TRL's output_dir), removed at its end
<runner>-steps.    a framework runner's own per-step log as the framework wrote it (verl's file logger): what
jsonl              the runner's step rows were read from
=================  ==========================================================================================

Beside the run directories, ``.compile-cache/`` holds torch.compile's caches for the compiled probes written to
that directory. A search's output directory holds ``study.db`` (its Optuna study, by default), ``search.json``
(its result) and ``runs/`` (its probes' run directories).

The strict readers (:func:`read_config`, :func:`read_summary`, ...) serve code that needs the file to be right;
:func:`read_lenient` and :func:`read_search_lenient` serve the report, which shows what a partial or broken
directory holds and says what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml

from tunekit.config import ProbeConfig, Recipe, dump_recipe, validate

if TYPE_CHECKING:  # imported where a frame is read or written: a Ray worker or a rank that writes none skips it
    import pandas as pd

CONFIG = "config.yaml"
STEPS = "steps.parquet"
STEPS_LIVE = "steps.jsonl"
SAMPLES = "samples.parquet"
SAMPLE_COLUMNS = ("step", "prompt", "response", "answer", "reward")
EVAL_SAMPLES = "eval_samples.parquet"
EVAL_SAMPLE_COLUMNS = ("trained_steps", "prompt", "response", "answer", "reward")
RESULT = "result.json"
ABANDONED = "abandoned: "
"""How a summary's reason begins for a probe a search stopped part-way (its trial is probed again)."""
POLICY = "policy"
"""The trained policy a probe wrote (``probe.save_policy``): a Hugging Face checkpoint directory."""
STARTUP = "startup.json"
NVML = "nvml.parquet"
LOG = "log.txt"
FIRST_ATTEMPT_LOG = "log-first-attempt.txt"
SUMMARY = "summary.json"
RAY = "ray.json"
WORKERS = "workers.json"
RAY_TOKEN = "ray-auth-token"
"""The token of the Ray cluster a probe's driver starts for simulated nodes (readable by its owner only)."""
RAY_NODE_LOG = "ray-node{}.log"
"""The output of simulated node N's ``ray start`` (node 0 is the head)."""
TRACES = "traces"
PGID_SUFFIX = ".pgid"
_ERRORS = "error-rank*.json"

SEARCH_RESULT = "search.json"
STUDY_DB = "study.db"
SEARCH_RUNS = "runs"
SEARCH_LOADTESTS = "loadtests"
"""A search's load tests of its rollout configurations (``search.loadtest_screen``), one directory each."""

LOADTEST = "loadtest.json"
"""``tunekit loadtest``'s record, in a directory of its own (with the log of a server it started): the target,
one row per concurrency level, the pass line and its verdict; rewritten after every level, so an interrupted test
keeps the rows it measured."""
LOADTEST_PROMPTS = "loadtest-prompts.jsonl"
"""The prompts a load test sent, one ``{"prompt": text}`` a line (``vllm bench serve``'s custom dataset)."""

COMPILE_CACHE = ".compile-cache"
"""Beside the run directories, not in one: torch.compile's caches, shared by the compiled probes written to one
directory (a search's)."""

RUN_DIR_ENV = "TUNEKIT_RUN_DIR"
"""Set to the run directory in every process of a probe (inherited, Ray's workers too): the tag that finds them."""

Status = Literal["running", "ok", "oom", "timeout", "failed", "pruned"]
"""A probe's ``summary.json`` status: ``running`` until the launcher records how it ended; ``pruned`` when a
search stopped it early on cost."""
STATUSES: tuple[str, ...] = get_args(Status)


def compile_cache_dir(run_dir: Path) -> Path:
    """The compile cache that ``run_dir``'s probe shares with the other probes of its output directory."""
    return Path(run_dir).resolve().parent / COMPILE_CACHE


def new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.getpid() % 10000:04d}{time.time_ns() % 1000:03d}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    tmp.replace(path)


# ------------------------------------------------------------------ config.yaml


def write_config(run_dir: Path, recipe: Recipe) -> None:
    (Path(run_dir) / CONFIG).write_text(dump_recipe(recipe))


def read_config(run_dir: Path) -> Recipe:
    """The probe's resolved recipe (a TunekitError if it is not one)."""
    path = Path(run_dir) / CONFIG
    return validate(yaml.safe_load(path.read_text()), str(path))


def find_configs(root: Path) -> list[Path]:
    """Every run directory's config.yaml under ``root`` (:func:`find_run_dirs`)."""
    return sorted(d / CONFIG for d in find_run_dirs(root) if (d / CONFIG).exists())


# ------------------------------------------------------------------ summary.json, result.json, errors


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_json(Path(run_dir) / SUMMARY, summary)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / SUMMARY
    return json.loads(p.read_text()) if p.exists() else None


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    write_json(Path(run_dir) / RESULT, result)


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """result.json, or None when the probe did not finish its steps."""
    p = Path(run_dir) / RESULT
    return json.loads(p.read_text()) if p.exists() else None


def write_startup(run_dir: Path, record: dict[str, Any]) -> None:
    write_json(Path(run_dir) / STARTUP, record)


def read_startup(run_dir: Path) -> dict[str, Any] | None:
    """startup.json, or None when the probe finished no step or the file is unreadable (a probe's record of how it
    started is read to price other runs, never to fail one)."""
    try:
        data = json.loads((Path(run_dir) / STARTUP).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_error(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    """A failed rank's record: ``status`` (oom / failed), ``message``, optionally ``traceback``."""
    write_json(Path(run_dir) / f"error-rank{rank}.json", record)


def set_attempt_aside(run_dir: Path) -> None:
    """Before a probe runs again in ``run_dir``: its first attempt's output kept as :data:`FIRST_ATTEMPT_LOG`, and
    everything else its processes wrote removed (the config and the summary stay)."""
    run_dir = Path(run_dir)
    if (run_dir / LOG).exists():
        (run_dir / LOG).replace(run_dir / FIRST_ATTEMPT_LOG)
    for p in run_dir.iterdir():
        if p.name not in (CONFIG, SUMMARY, FIRST_ATTEMPT_LOG):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def read_errors(run_dir: Path) -> list[dict[str, Any]]:
    """The failed ranks' records, each with its ``rank`` (from the file name)."""
    return [json.loads(p.read_text()) | {"rank": int(p.stem.removeprefix("error-rank"))}
            for p in sorted(Path(run_dir).glob(_ERRORS))]


def span_s(run_dir: Path) -> float:
    """Seconds from config.yaml's writing to the run directory's last change (but summary.json): how long a probe
    whose launcher was killed ran."""
    run_dir = Path(run_dir)
    times = [p.stat().st_mtime for p in run_dir.iterdir() if p.name != SUMMARY]
    if not times:
        return 0.0
    start = (run_dir / CONFIG).stat().st_mtime if (run_dir / CONFIG).exists() else min(times)
    return max(0.0, max(times) - start)


def read_log(run_dir: Path) -> list[str]:
    """The lines of the probe's output (log.txt); none before it exists."""
    p = Path(run_dir) / LOG
    return p.read_text(errors="replace").strip().splitlines() if p.exists() else []


def read_all_output(run_dir: Path) -> list[str]:
    """The lines of the probe's output and of every server it started (``<name>.log``)."""
    servers = sorted(Path(run_dir).glob("*.log"))
    return read_log(run_dir) + [line for p in servers for line in p.read_text(errors="replace").splitlines()]


# ------------------------------------------------------------------ steps


class StepLog:
    """Rows of per-step metrics; appended to steps.jsonl as they come (progress + crash safety),
    and written to steps.parquet on :meth:`flush`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.rows: list[dict[str, float]] = []
        self._jsonl = self.run_dir / STEPS_LIVE

    def append(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        with self._jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        if self.rows:
            import pandas as pd

            steps = pd.DataFrame(self.rows)
            if "step" in steps:  # an integer whatever the runner logged it as (TRL's callback: a float)
                steps["step"] = steps["step"].astype("int64")
            steps.to_parquet(self.run_dir / STEPS, index=False)


def read_steps(run_dir: Path) -> pd.DataFrame:
    """steps.parquet, or steps.jsonl where it holds more: a probe that died or was stopped after its last flush
    (the parquet is written every ten steps) has its later steps only in the JSON lines."""
    import pandas as pd

    run_dir = Path(run_dir)
    parquet = pd.read_parquet(run_dir / STEPS) if (run_dir / STEPS).exists() else pd.DataFrame()
    live = live_rows(run_dir)
    return pd.DataFrame(live) if len(live) > len(parquet) else parquet


def steps_done(run_dir: Path) -> int:
    p = Path(run_dir) / STEPS_LIVE
    if not p.exists():
        return 0
    with p.open() as f:
        return sum(1 for _ in f)


def live_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of the steps a running probe has finished so far (steps.jsonl; a half-written last line is left out)."""
    p = Path(run_dir) / STEPS_LIVE
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip().endswith("}")]


# ------------------------------------------------------------------ samples


def keeps_samples(step: int, steps: int) -> bool:
    """Whether a probe of ``steps`` steps keeps samples of ``step`` (from 0): the first and last five, every tenth."""
    return step < 5 or step >= steps - 5 or step % 10 == 0


def spread(n: int, k: int) -> list[int]:
    """``k`` of ``n`` row indices spread evenly from the first (a batch's rows come grouped by prompt: different
    prompts), or all ``n`` when there are no more."""
    return list(range(n)) if n <= k else [i * n // k for i in range(k)]


class SampleLog:
    """What the model said: a few responses (with prompt, answer and reward) of the steps :func:`keeps_samples`
    names, rewritten to samples.parquet as each kept step comes, so a killed probe keeps what it had."""

    def __init__(self, run_dir: Path, probe: ProbeConfig) -> None:
        """Keeps ``probe.samples_per_step`` responses of the kept steps of a probe of ``probe.steps`` steps."""
        self.path = Path(run_dir) / SAMPLES
        self.steps, self.per_step = probe.steps, probe.samples_per_step
        self.rows: list[dict[str, Any]] = []

    def wants(self, step: int) -> bool:
        return self.per_step > 0 and keeps_samples(step, self.steps)

    def add(self, step: int, prompts: Sequence[Any], responses: Sequence[Any], answers: Sequence[Any],
            rewards: Sequence[float]) -> None:
        """One step's batch (the four sequences row-aligned); keeps :attr:`per_step` rows of a kept step."""
        if not self.wants(step):
            return
        self.rows += sample_rows("step", step, prompts, responses, answers, rewards, spread(len(responses), self.per_step))
        write_rows(self.path, self.rows, SAMPLE_COLUMNS)


class EvalSampleLog:
    """What the model answered the held-out prompts: every response of each evaluation, rewritten to
    eval_samples.parquet as each evaluation comes."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / EVAL_SAMPLES
        self.rows: list[dict[str, Any]] = []

    def add(self, trained_steps: int, prompts: Sequence[Any], responses: Sequence[Any], answers: Sequence[Any],
            rewards: Sequence[float]) -> None:
        """One evaluation after ``trained_steps`` steps (0: before the first), its four sequences row-aligned."""
        self.rows += sample_rows("trained_steps", trained_steps, prompts, responses, answers, rewards, range(len(responses)))
        write_rows(self.path, self.rows, EVAL_SAMPLE_COLUMNS)


def sample_rows(key: str, value: int, prompts: Sequence[Any], responses: Sequence[Any], answers: Sequence[Any],
                rewards: Sequence[float], keep: Iterable[int]) -> list[dict[str, Any]]:
    """Rows ``keep`` of one batch, each with ``key``: ``value`` (the step, or the steps trained)."""
    return [{key: int(value), "prompt": str(prompts[i]), "response": str(responses[i]),
             "answer": None if answers[i] is None else str(answers[i]), "reward": float(rewards[i])} for i in keep]


def write_rows(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` as the Parquet file ``path``, replaced whole (a reader never sees half of it)."""
    import pandas as pd

    tmp = path.with_suffix(".tmp")
    pd.DataFrame(rows, columns=list(columns)).to_parquet(tmp, index=False)
    tmp.replace(path)


def read_samples(run_dir: Path, name: str = SAMPLES) -> pd.DataFrame:
    """samples.parquet (:class:`SampleLog`), or with ``name`` :data:`EVAL_SAMPLES` eval_samples.parquet
    (:class:`EvalSampleLog`); empty with its columns when the probe kept none or it is unreadable."""
    import pandas as pd

    try:
        return pd.read_parquet(Path(run_dir) / name)
    except (OSError, ValueError):
        return pd.DataFrame(columns=list(EVAL_SAMPLE_COLUMNS if name == EVAL_SAMPLES else SAMPLE_COLUMNS))


# ------------------------------------------------------------------ the rest


def nvml_path(run_dir: Path) -> Path:
    return Path(run_dir) / NVML


def log_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOG


def trace_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TRACES / f"rank{rank}"


def framework_steps(run_dir: Path, name: str) -> Path:
    """Where a runner's framework writes its own per-step log (kept: the source of the run's step rows)."""
    return Path(run_dir) / f"{name}-steps.jsonl"


def framework_dir(run_dir: Path, name: str) -> Path:
    """Where a runner's framework writes its own output during a probe (removed at the end; nothing is kept)."""
    return Path(run_dir) / name


def server_files(run_dir: Path, name: str) -> tuple[Path, Path]:
    """The log and the process-group file of a server named ``name`` that a probe starts."""
    return Path(run_dir) / f"{name}.log", Path(run_dir) / f"{name}{PGID_SUFFIX}"


def server_groups(run_dir: Path) -> list[Path]:
    """Process-group files of the servers a probe started and has not stopped."""
    return sorted(Path(run_dir).glob(f"*{PGID_SUFFIX}"))


def write_loadtest(out_dir: Path, record: dict[str, Any]) -> Path:
    path = Path(out_dir) / LOADTEST
    write_json(path, record)
    return path


def read_loadtest(out_dir: Path) -> dict[str, Any] | None:
    p = Path(out_dir) / LOADTEST
    return json.loads(p.read_text()) if p.exists() else None


def find_loadtests(root: Path) -> list[Path]:
    """``loadtest.json`` at ``root``, else every one under it."""
    root = Path(root)
    return [root / LOADTEST] if (root / LOADTEST).exists() else sorted(root.rglob(LOADTEST))


# ------------------------------------------------------------------ lenient reading, for the report

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is 10x faster on 200 configs


@dataclass
class RunFiles:
    """What a run directory holds, read without failing: an absent or unreadable file is empty and named in
    ``missing``."""

    summary: dict[str, Any]
    config: dict[str, Any]
    """The resolved recipe as written (a mapping, not validated)."""
    steps: pd.DataFrame
    nvml: pd.DataFrame
    missing: list[str] = field(default_factory=list)
    """Files that are absent or unreadable, each as one phrase."""
    samples: pd.DataFrame = field(default_factory=lambda: _empty_frame(SAMPLE_COLUMNS))
    """samples.parquet (:func:`read_samples`)."""
    eval_samples: pd.DataFrame = field(default_factory=lambda: _empty_frame(EVAL_SAMPLE_COLUMNS))
    """eval_samples.parquet (:func:`read_samples`)."""


def _lenient(path: Path, parse, missing: list[str], *, errors: tuple[type[BaseException], ...]) -> dict[str, Any]:
    if not path.exists():
        missing.append(f"no {path.name}")
        return {}
    try:
        data = parse(path.read_text())
    except (OSError, *errors) as e:
        missing.append(f"{path.name} unreadable ({type(e).__name__})")
        return {}
    return data if isinstance(data, dict) else {}


def _empty_frame(columns: Sequence[str] = ()) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(columns=list(columns))


def _lenient_frame(parquet: Path, missing: list[str]) -> pd.DataFrame:
    import pandas as pd

    try:
        if parquet.exists():
            return pd.read_parquet(parquet)
    except (OSError, ValueError) as e:
        missing.append(f"{parquet.name} unreadable ({type(e).__name__})")
        return pd.DataFrame()
    missing.append(f"no {parquet.name}")
    return pd.DataFrame()


def _lenient_steps(run_dir: Path, missing: list[str]) -> pd.DataFrame:
    """:func:`read_steps`, with what it could not read noted in ``missing``."""
    try:
        steps = read_steps(run_dir)
    except (OSError, ValueError) as e:
        missing.append(f"{STEPS} unreadable ({type(e).__name__})")
        return _empty_frame()
    if steps.empty:
        missing.append(f"no {STEPS}")
    return steps


def read_lenient(run_dir: Path) -> RunFiles:
    """summary.json, config.yaml, the steps (parquet, else the live jsonl) and the NVML samples of a run directory
    that may be partial or broken. Absent NVML samples are only missing when the summary says NVML sampled. A
    summary without a start-up (a probe still running, or stopped before its result) takes its first step's
    record of it (startup.json)."""
    run_dir, missing = Path(run_dir), []
    summary = _lenient(run_dir / SUMMARY, json.loads, missing, errors=(ValueError,))
    if "startup_s" not in summary and (started := read_startup(run_dir)):  # a probe stopped before its result
        summary = started | summary
    config = _lenient(run_dir / CONFIG, lambda t: yaml.load(t, Loader=_YAML_LOADER), missing, errors=(yaml.YAMLError,))
    steps = _lenient_steps(run_dir, missing)
    nvml_missing: list[str] = []
    nvml = _lenient_frame(run_dir / NVML, nvml_missing)
    if summary.get("nvml/available"):
        missing += nvml_missing
    return RunFiles(summary, config, steps, nvml, missing, read_samples(run_dir), read_samples(run_dir, EVAL_SAMPLES))


def find_run_dirs(root: Path) -> list[Path]:
    """Run directories at or under ``root``: directories holding summary.json or config.yaml, and not inside another."""
    root = Path(root)
    markers = (SUMMARY, CONFIG)
    if any((root / m).exists() for m in markers):
        return [root]
    found = {p.parent for m in markers for p in root.rglob(m)}
    # a runner's own files inside a run directory are not runs of their own (verl's Hydra output has a config.yaml)
    outermost = {d for d in found if not any(p in found for p in d.parents)}
    return sorted(outermost, key=lambda p: (p.name, str(p)))


def find_search_results(root: Path) -> list[Path]:
    """search.json at ``root``, else every one under it."""
    root = Path(root)
    return [root / SEARCH_RESULT] if (root / SEARCH_RESULT).exists() else sorted(root.rglob(SEARCH_RESULT))


def read_search_lenient(path: Path) -> dict[str, Any] | None:
    """A search.json with its directory under ``_dir``; ``_error`` when it can't be read, None when it is no mapping."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"_dir": str(Path(path).parent), "_error": f"{path} is unreadable"}
    return (data | {"_dir": str(Path(path).parent)}) if isinstance(data, dict) else None


def study_db(out_dir: Path) -> Path:
    """The default SQLite file of a search's study, in its output directory."""
    return Path(out_dir) / STUDY_DB
