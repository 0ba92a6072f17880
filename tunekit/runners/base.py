"""The interface every runner implements, and the environment every probe process starts from.

A runner turns a resolved recipe into a probe's process tree. The launcher
(:mod:`tunekit.launch`) preflights the recipe, creates the run directory, writes
``config.yaml``, starts ``command()`` with ``env()`` in a fresh session, and records
the outcome; the runner's processes write the run directory's per-step records
with tunekit's metric names, so nothing downstream asks which runner ran.
"""

from __future__ import annotations

import ast
import errno
import importlib.util
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

import tunekit
from tunekit.config import Recipe
from tunekit.config.errors import ConfigError, NotImplementedKnob
from tunekit.estimate.traits import RunnerTraits
from tunekit.placement.gpus import LAUNCH_GPUS_ENV, launch_gpus
from tunekit.profiler.startup import launch_stamp
from tunekit.rundir import RUN_DIR_ENV


RECIPE_FILE = "best-recipe.yaml"
"""The winner's resolved recipe, written beside a handed-back command that reads it (tunekit's or verl's data step)."""


@dataclass(frozen=True)
class Handback:
    """A search's winner in the runner's own words: the line to run and the files it reads (name -> text),
    which the caller writes next to each other."""

    command: str
    files: dict[str, str] = field(default_factory=dict)


class Runner(ABC):
    """One way to run a probe. Subclasses set ``name`` (its key in :data:`tunekit.runners.RUNNERS` and the
    recipe's ``runner`` value) and ``traits``, and implement :meth:`command` and :meth:`handback`. Its ``traits``
    and :meth:`training_path` are what the estimate asks of it (:class:`~tunekit.estimate.traits.RunnerRules`)."""

    name: ClassVar[str]
    traits: ClassVar[RunnerTraits]
    """What its framework does that the memory estimate and the compile cache's key count."""

    def check(self, recipe: Recipe, cuda_count: int) -> None:
        """Refuse, before anything is written, a knob this runner cannot express or that this machine lacks for
        it: raise a TunekitError (ConfigError, NotImplementedKnob) with one sentence naming the key. Runs after
        the checks every runner shares (:mod:`tunekit.launch.preflight`). Default: nothing to refuse."""

    def refusal(self, recipe: Recipe, *, gpu: bool) -> str | None:
        """The first knob of ``recipe`` this runner cannot express on a machine with its GPUs (``gpu``) or CPU,
        whatever is installed here: what an estimate must not price. Default: none."""
        return None

    @abstractmethod
    def command(self, recipe: Recipe, run_dir: Path) -> list[str]:
        """The probe's root process: it reads ``run_dir/config.yaml`` and writes the run directory's records."""

    def env(self, recipe: Recipe, run_dir: Path, *, on_gpu: bool) -> dict[str, str]:
        """The root process's environment. Default: :func:`probe_env` (every launcher GPU visible)."""
        return probe_env(run_dir, on_gpu=on_gpu)

    @abstractmethod
    def training_path(self, recipe: Recipe, *, gpu: bool) -> dict[str, bool]:
        """What the probe's policy runs as, ``system.memory.fsdp_single_gpu`` and ``system.compile`` resolved on
        this machine (``auto`` included): ``resolved/fsdp`` (FSDP2, else the plain module) and ``resolved/compile``
        (torch.compile), ``resolved/master_weights`` (bf16 weights beside fp32 masters,
        ``system.memory.master_weights``) and ``resolved/cuda_graphs`` (compiled passes replayed as CUDA graphs,
        ``system.cuda_graphs``); ``resolved/old_logprob``: whether a step runs the old policy's forward over the batch
        before the update (the ``old_logprob`` phase), by the framework's own rule. The launcher writes them into the
        probe's summary."""

    @abstractmethod
    def handback(self, recipe: Recipe, steps: int, *, gpu_profile: str | None = None) -> Handback:
        """``recipe`` (a search's winner) as the user runs it for the full run's ``steps`` (what the search priced);
        ``gpu_profile``: the price profile the search was given (None: detected), for a run tunekit prices itself."""


def probe_env(run_dir: Path | None, *, on_gpu: bool) -> dict[str, str]:
    """This process's environment plus what every probe process needs: the run-dir tag, tunekit importable,
    the launch time (:mod:`tunekit.profiler.startup`), the launcher's GPU view (:mod:`tunekit.placement.gpus`), one OpenMP
    thread per process on CPU."""
    env = dict(os.environ) | launch_stamp()
    if run_dir is not None:  # inherited by every process of the probe (Ray's too): a tag to find them by
        env[RUN_DIR_ENV] = str(Path(run_dir).resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tunekit.__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' progress bars: noise in log.txt
    if on_gpu:  # the launcher's GPUs, for the probe's processes that need physical ids
        seen = launch_gpus(env)
        env[LAUNCH_GPUS_ENV] = ",".join(seen if seen is not None else map(str, range(torch.cuda.device_count())))
    else:
        # one thread per rank: the embedded model is too small to gain from more, and spinning
        # OpenMP threads on a busy machine make each op ~30x slower (measured: 0.70 s vs 0.02 s a forward)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def compile_cache_env(cache_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """For a runner whose probes compile or start a vLLM engine: the caches a later probe of the same shapes starts
    warm from, all in ``cache_dir`` (:func:`tunekit.rundir.compile_cache_dir`), beside the run directories, so every
    probe of a search (or of one output directory) shares them and only the first pays a cold start:

    - Inductor's (``TORCHINDUCTOR_CACHE_DIR``): compiled graphs, AOTAutograd's forward/backward pairs, Triton's
      kernels under it; the two switches keep a value ``env`` gives them. The directory always replaces the one in
      ``env`` (importing Inductor writes its default there, so a value found there says nothing about the user's
      wish). Dynamo still traces in every process (``compile/dynamo_s``): a warm cache saves code generation and
      kernel compilation (``compile/backend_s`` becomes loads). torch's artifacts that would skip the trace too
      (``torch._dynamo.config.caching_precompile``, ``torch.compile(...).aot_compile``) cannot hold a transformers
      model's graphs: its guards on object identity do not serialise;
    - vLLM's (``VLLM_CACHE_ROOT``): its compiled graphs when its engine compiles. An in-process engine points
      Inductor's and Triton's directories into its own while it compiles; the rollout puts them back afterwards
      (:mod:`tunekit.trainer.rollout.vllm_engine`), so the trainer's graphs stay shared across engine settings.

    Dynamo's automatic-dynamic profile is not shared (no ``TORCH_COMPILE_JOB_ID`` is set): a later probe would
    compile the dimensions an earlier one found dynamic as dynamic from its first call, other graphs than its own
    cold start compiles, so a warm probe could measure another step. ``torch.compiler.save_cache_artifacts`` packs
    these same entries to carry them to another machine; probes on one machine share the directory itself.

    Every entry is written atomically by its owner (a temporary file renamed into place), so probes writing at once
    leave whole entries, and a corrupt entry reads as a miss. A generated module that is corrupt
    (:func:`unreadable_code`) is removed (Inductor writes it again from its graph's entry; it never rewrites one
    that exists), and the probe says so. A directory this process cannot write (read-only, a file in its way, a full
    disk, less than :data:`MIN_FREE_BYTES` free) is replaced by a fresh private one, removed when the probe ends
    (:func:`remove_private_cache`): the probe runs cold, and :data:`CACHE_STATE_ENV` says why."""
    state = SHARED
    try:
        check_writable(cache_dir)
        if (bad := unreadable_code(cache_dir)) is not None:
            state = f"{SHARED}; {remove_corrupt(bad)}"
    except OSError as e:
        return private_cache_env(env, f"{cache_dir} is not writable ({e.strerror or e}); this probe compiled into a "
                                      "private directory")
    return _cache_vars(cache_dir, env, state)


def _cache_vars(cache_dir: Path, env: dict[str, str], state: str) -> dict[str, str]:
    """Every cache's directory in ``cache_dir``, Inductor's two switches as ``env`` gives them (else on), and
    :data:`CACHE_STATE_ENV` ``state``."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": env.get("TORCHINDUCTOR_FX_GRAPH_CACHE", "1"),
            "TORCHINDUCTOR_AUTOGRAD_CACHE": env.get("TORCHINDUCTOR_AUTOGRAD_CACHE", "1"),
            "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
            CACHE_STATE_ENV: state}


def private_cache_env(env: dict[str, str], why: str) -> dict[str, str]:
    """``env`` for a probe that runs cold in a fresh private directory (:data:`CACHE_STATE_ENV`: ``cold: <why>``):
    Inductor's compile-thread count back at its default unless the user set one (the cold compile needs its pool)
    and no mark of compiled shapes to write."""
    out = {k: v for k, v in env.items() if k != COMPILED_MARK_ENV
           and not (k == COMPILE_THREADS_ENV and COMPILE_THREADS_ENV not in os.environ)}
    return out | _cache_vars(Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX)), env, f"cold: {why}")


def shares_cache(env: dict[str, str]) -> bool:
    """Whether a probe's environment points at its output directory's shared compile cache (:data:`CACHE_STATE_ENV`
    ``shared``, with or without a repair said after it); False where it set no cache or a private one."""
    return env.get(CACHE_STATE_ENV, "").startswith(SHARED)


CACHE_FAILURES = ("No space left on device", "Read-only file system", "Errno 28", "Errno 30", "InductorError",
                  "BackendCompilerFailed")
"""What a probe's failure says when the shared compile cache may have caused it: a full or read-only disk under a
write, or a compile that failed (a cache entry that loads and breaks it)."""


def cache_broke(reason: str, env: dict[str, str]) -> bool:
    """Whether a failed probe that compiled with the shared cache (``env``) failed in a way the cache may have caused
    (:data:`CACHE_FAILURES`): it runs once more, cold, in a private directory."""
    return shares_cache(env) and any(w in reason for w in CACHE_FAILURES)


COMPILED_SHAPES = "compiled-shapes"
"""Under a compile cache: one empty file per graphs key (:func:`tunekit.estimate.cold_start.graphs_key`) whose probe
finished a step, its graphs written into the cache."""
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"
COMPILED_MARK_ENV = "TUNEKIT_COMPILED_MARK"
"""The file the launcher writes once the probe has finished a step with the shared cache (:func:`warm_start_env`)."""


def warm_start_env(cache_dir: Path, key: str, env: dict[str, str]) -> dict[str, str]:
    """For a probe whose shapes (``key``) an earlier probe already compiled into the shared ``cache_dir``: one
    Inductor compile thread, unless ``env`` sets the count. Its graphs are loads from the cache then, and the
    worker pool that Inductor starts for parallel compilation (a process per core, each importing torch) only
    competes with the engine's start (``benchmarks/README.md``, fixed costs: a warm probe reached its first step
    sooner with one thread, its first step as fast). A cold probe keeps the pool, which its compilation needs. Always names the mark the launcher writes
    (:data:`COMPILED_MARK_ENV`) when the probe has finished a step."""
    mark = cache_dir / COMPILED_SHAPES / key
    out = {COMPILED_MARK_ENV: str(mark)}
    if mark.exists() and COMPILE_THREADS_ENV not in env:
        out[COMPILE_THREADS_ENV] = "1"
    return out


def mark_compiled(env: dict[str, str]) -> None:
    """After a probe that finished a step with the shared cache: its shapes are compiled there (a lost mark only
    leaves the next probe at the default thread count)."""
    if not shares_cache(env) or not env.get(COMPILED_MARK_ENV):
        return
    mark = Path(env[COMPILED_MARK_ENV])
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except OSError:
        pass


def unreadable_code(cache_dir: Path) -> Path | None:
    """The first of Inductor's generated Python modules in ``cache_dir`` (``<2 letters>/<key>.py``) that does not
    parse, or a graph's module cut short where it still parses (it starts Inductor's kernel compiler,
    ``AsyncCompile``, and never binds the ``call`` a cache hit runs); None when every one is whole. torch reads a
    corrupt cache entry as a miss, but imports the module an entry names and fails the compile on such a one."""
    for path in cache_dir.glob("??/*.py"):
        try:
            text = path.read_bytes()
            tree = ast.parse(text, str(path))
        except (SyntaxError, ValueError):
            return path
        if b"AsyncCompile" in text and not any(_binds_call(node) for node in tree.body):
            return path
    return None


def _binds_call(node: ast.stmt) -> bool:
    """Whether a module's top-level statement binds ``call``: ``def call(...)`` or ``call = runner.call``."""
    if isinstance(node, ast.FunctionDef):
        return node.name == "call"
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "call" for t in node.targets)


def remove_corrupt(module: Path) -> str:
    """Take a corrupt generated module (:func:`unreadable_code`) out of the cache, and say what was done: the graph's
    own entry writes it again when a probe loads it. Another probe may remove it first: the same outcome."""
    try:
        module.unlink(missing_ok=True)
    except OSError as e:
        return f"{module} is corrupt and could not be removed ({e.strerror or e})"
    return f"removed {module}, which was corrupt: its graph compiles again"


SHARED = "shared"
CACHE_STATE_ENV = "TUNEKIT_COMPILE_CACHE"
"""Set by :func:`compile_cache_env`: ``shared`` (with what was repaired, after ``;``), or ``cold: <why>`` when the
shared directory could not be used."""
PRIVATE_PREFIX = "tunekit-compile-cache-"
MIN_FREE_BYTES = 2 * 1024**3
"""Free space a shared compile cache must have at a probe's launch: a cold compile writes kernels, graphs and vLLM's
artifacts there (hundreds of megabytes for a small model), and a write that finds the disk full fails the compile."""


def check_writable(directory: Path) -> None:
    """Raise OSError unless ``directory`` exists (made here if not), takes a new file and has
    :data:`MIN_FREE_BYTES` free."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-") as f:
        f.write(b"\0" * 4096)
        f.flush()
        os.fsync(f.fileno())
    free = shutil.disk_usage(directory).free
    if free < MIN_FREE_BYTES:
        raise OSError(errno.ENOSPC, f"{free / 1024**2:.0f} MiB free, under the {MIN_FREE_BYTES / 1024**3:.0f} GiB a "
                                    "cold compile may write")


def remove_private_cache(env: dict[str, str]) -> None:
    """After a probe that compiled into a private directory (:func:`compile_cache_env`): the directory is removed."""
    if CACHE_STATE_ENV not in env or shares_cache(env) or "TORCHINDUCTOR_CACHE_DIR" not in env:
        return
    private = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    if private.name.startswith(PRIVATE_PREFIX):
        shutil.rmtree(private, ignore_errors=True)


def check_framework(runner: str, refused: Iterable[str], module: str, framework: str) -> None:
    """The preflight a framework's runner starts with: the first knob it cannot express (one sentence naming the
    key), then whether the framework is installed; nothing is launched."""
    for problem in refused:
        raise NotImplementedKnob(problem)
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"runner {runner} needs {framework}, which is not installed; run `pip install -e \".[{runner}]\"` "
                          "or use runner builtin.")
