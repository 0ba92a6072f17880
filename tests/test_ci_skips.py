"""A test that needs a service skips locally with its reason and fails in CI (CI=true), where the service must be up."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

INNER = """
import pytest

@pytest.mark.service("PostgreSQL")
@pytest.mark.skipif(True, reason="no PostgreSQL here")
def test_needs_postgres():
    pass

@pytest.mark.skipif(True, reason="checks the path taken without GPUs")
def test_skips_for_another_reason():
    pass
"""


@pytest.mark.parametrize("ci, errors, skipped", [("", 0, 2), ("true", 1, 1), ("false", 0, 2)])
def test_a_service_skip_fails_only_in_ci(pytester, monkeypatch, ci, errors, skipped):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini('[pytest]\nmarkers =\n    service(name): needs a service\n')
    pytester.makepyfile(INNER)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=errors, skipped=skipped)  # a skip in setup becomes an error there
    assert (result.ret != 0) == bool(errors)
    if errors:
        result.stdout.fnmatch_lines(["*PostgreSQL is required in CI*no PostgreSQL here*"])
