"""In CI a test that needs a service (PostgreSQL, Chromium) must not pass by skipping: set ``CI=true`` and a skip
of a test marked ``service`` is reported as a failure. Locally such tests skip with their reason."""

from __future__ import annotations

import os

import pytest


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("service")
    if marker is None or not report.skipped or not _in_ci():
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{marker.args[0]} is required in CI (CI={os.environ['CI']}) but the test skipped: {reason}"


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
