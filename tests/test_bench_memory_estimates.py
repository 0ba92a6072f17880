"""benchmarks/memory_estimates.py: the estimate-vs-measured table over probes' summaries."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_estimates  # noqa: E402


def _summary(d: Path, **fields) -> None:
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"recipe": "r", "gpus_held": 1, **fields}))


def test_counts_only_probes_with_a_measured_peak(tmp_path):
    _summary(tmp_path / "a" / "runs" / "p1", status="ok", **{"memory/estimate_gb": 9.0, "memory/measured_gb": 10.0,
                                                             "memory/estimate_error": -0.1})
    _summary(tmp_path / "a" / "runs" / "p2", status="ok", **{"memory/estimate_gb": 12.0, "memory/measured_gb": 10.0,
                                                             "memory/estimate_error": 0.2})
    _summary(tmp_path / "b" / "p3", status="timeout", **{"memory/estimate_gb": 30.0, "memory/measured_gb": None,
                                                         "memory/estimate_error": None})
    _summary(tmp_path / "b" / "cpu", status="ok")  # a CPU probe: no estimate at all
    t = memory_estimates.table(memory_estimates.rows([tmp_path / "a", tmp_path / "b"]))
    assert [r["run"] for r in t["rows"]] == ["p1", "p2", "p3"]
    assert t["n"] == 2 and t["worst_error"] == 0.2
    assert abs(t["median_error"] - 0.05) < 1e-12 and abs(t["median_abs_error"] - 0.15) < 1e-12


def test_an_out_of_memory_probe_is_listed_apart_not_counted(tmp_path):
    _summary(tmp_path / "p1", status="ok", **{"memory/estimate_gb": 9.0, "memory/measured_gb": 10.0,
                                              "memory/estimate_error": -0.1})
    # NVML saw 131 GiB when the next allocation failed: what the probe needed is more, so no error is read from it
    _summary(tmp_path / "p2", status="oom", **{"memory/estimate_gb": 150.0, "memory/measured_gb": 131.0,
                                               "memory/estimate_error": 0.145})
    t = memory_estimates.table(memory_estimates.rows([tmp_path]))
    assert t["n"] == 1 and t["worst_error"] == -0.1
    assert t["out_of_memory"] == [{"run": "p2", "estimate_gb": 150.0, "measured_gb": 131.0}]
