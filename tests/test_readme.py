"""The README says what is true: which commands take --set, every file a probe writes, an estimate example that
runs from a fresh clone once the quick start's probe has."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunekit.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
runner = CliRunner()


def _commands_taking_set() -> set[str]:
    sentence = next(line for line in README.splitlines() if "take `--set" in line)
    return set(re.findall(r"`(?:tunekit )?(\w+)`", sentence.split("take `--set")[0]))


def test_the_readme_names_the_commands_that_take_set():
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    def options(name: str) -> list[str]:  # the option names in the help's table (a description may mention --set)
        out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        return [m.group(1) for m in re.finditer(r"^\W*(--[\w-]+)", out, flags=re.M)]

    taking = {n for n in names if "--set" in options(n)}
    assert taking and _commands_taking_set() == taking


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory) -> Path:
    """A fresh directory where the quick start's probe ran (shortened to 4 steps)."""
    where = tmp_path_factory.mktemp("fresh")
    cwd = os.getcwd()
    os.chdir(where)
    try:
        res = runner.invoke(app, ["probe", "--steps", "4"])
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, res.output
    return where


@pytest.mark.slow
def test_every_file_a_probe_writes_is_in_the_readme(quick_start):
    (run_dir,) = (quick_start / "runs").iterdir()
    table = README[README.index("| file | what |"):README.index("## Commands")]
    for f in run_dir.iterdir():
        assert f"`{f.name}`" in table, f"README's run-directory table does not name {f.name}"


@pytest.mark.slow
def test_the_readme_estimate_example_runs_after_the_quick_start(quick_start, monkeypatch):
    lines = [line.split("#")[0] for line in README.splitlines() if line.startswith("tunekit estimate")]
    assert lines
    monkeypatch.chdir(quick_start)
    for line in lines:
        res = runner.invoke(app, shlex.split(line)[1:])
        assert res.exit_code == 0, (line, res.output)
