"""benchmarks/: every script parses, and collect.py files a table under its claim with its date and machine."""

from __future__ import annotations

import json
import py_compile
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from collect import collect  # noqa: E402


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_every_benchmark_script_parses(script, tmp_path):
    py_compile.compile(str(BENCH / script), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_collect_appends_once_with_date_machine_and_no_output_paths(tmp_path):
    table = tmp_path / "trl_grpo_graphs.json"
    table.write_text(json.dumps({"meta": {"date": "2026-11-30 03:46", "command": "trl_grpo.py --out /tmp/a/job0"},
                                 "rows": {"tunekit": {"run_dir": "/tmp/a/job0/runs/tunekit-grpo-034838",
                                                      "step_s_median": 1.73}}}))
    results = tmp_path / "results"
    for _ in range(2):  # filing the same table twice keeps one entry
        out = collect("trl_grpo", [table], machine="nvidia-h200-x2", note="graphs", results=results)
    (entry,) = json.loads(out.read_text())
    assert (entry["date"], entry["machine"], entry["source"], entry["note"]) == (
        "2026-11-30", "nvidia-h200-x2", "trl_grpo_graphs.json", "graphs")
    assert entry["table"]["rows"]["tunekit"] == {"run_dir": "$OUT/tunekit-grpo-034838", "step_s_median": 1.73}
    assert entry["table"]["meta"]["command"] == "trl_grpo.py --out $OUT"


def test_collect_needs_a_date_when_the_table_has_none(tmp_path):
    table = tmp_path / "fidelity.json"
    table.write_text(json.dumps({"a-ppo-probe100": {"status": "ok"}}))
    with pytest.raises(SystemExit, match="--date"):
        collect("projection_fidelity", [table], machine="cpu-2core", results=tmp_path / "results")
    out = collect("projection_fidelity", [table], machine="cpu-2core", date="2026-11-29", results=tmp_path / "results")
    assert json.loads(out.read_text())[0]["date"] == "2026-11-29"
