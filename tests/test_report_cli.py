"""`tunekit report` through the CLI: a report for good input, one sentence and exit 2 (nothing written) for bad input."""

from __future__ import annotations


from report_synth import write_run
from typer.testing import CliRunner

from tunekit.cli import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["report", *args])


def test_report_writes_the_file(tmp_path):
    write_run(tmp_path / "runs", "a")
    out = tmp_path / "deep" / "dir" / "r.html"
    res = _run(str(tmp_path / "runs"), "-o", str(out))
    assert res.exit_code == 0, res.output
    assert out.exists() and f"report: {out}" in res.output


def test_report_creates_a_missing_relative_folder_and_refuses_a_folder_name(tmp_path, monkeypatch):
    write_run(tmp_path / "runs", "a")
    monkeypatch.chdir(tmp_path)
    res = _run("runs", "-o", "some/missing/folder/x.html")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "some" / "missing" / "folder" / "x.html").is_file()
    # a trailing slash names a folder, not the file to write: refused before anything is made
    res = _run("runs", "-o", "newdir/")
    assert res.exit_code == 2 and "names a folder" in res.output and "newdir/report.html" in res.output
    assert not (tmp_path / "newdir").exists()


def test_report_default_output_is_reports_report_html(tmp_path, monkeypatch):
    write_run(tmp_path / "runs", "a")
    monkeypatch.chdir(tmp_path)
    assert _run("runs").exit_code == 0
    assert (tmp_path / "reports" / "report.html").exists()


def test_path_without_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _run(str(tmp_path / "empty"), "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 2
    assert "has no probe runs" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.html").exists()


def test_no_path_and_no_storage(tmp_path):
    res = _run("-o", str(tmp_path / "r.html"))
    assert res.exit_code == 2 and "nothing to report" in res.output


def test_output_that_cannot_be_written(tmp_path):
    write_run(tmp_path / "runs", "a")
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    for bad in (blocker / "r.html", tmp_path / "runs"):
        res = _run(str(tmp_path / "runs"), "-o", str(bad))
        assert res.exit_code == 2, res.output
        assert "choose another output path" in res.output or "is a directory" in res.output
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "runs"]


def test_storage_that_does_not_exist(tmp_path):
    write_run(tmp_path / "runs", "a")
    res = _run(str(tmp_path / "runs"), "--storage", f"sqlite:///{tmp_path / 'none.db'}", "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 2 and "no such SQLite file" in res.output
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "r.html").exists()


def test_old_records_render_and_say_what_is_missing(tmp_path):
    run = write_run(tmp_path / "runs", "old", drop_summary=("steady", "cost/projected_yuan"), nvml_samples=0)
    (run / "steps.parquet").unlink()
    out = tmp_path / "r.html"
    res = _run(str(tmp_path / "runs"), "-o", str(out))
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "no steps.parquet: run 1" in text and "summary.json has no cost/projected_yuan: run 1" in text
