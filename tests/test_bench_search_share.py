"""benchmarks/search_fixed_share.py: a search's share of probe time outside steady steps, and the same share had
every probe started cold or had the search run on one machine, read from run directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tunekit import rundir
from tunekit.config import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import search_fixed_share  # noqa: E402


def _probe(runs: Path, name: str, *, wall: float, steps: list[float], cache: str, key: str,
           field: str = "startup/start_key") -> None:
    run = runs / name
    run.mkdir(parents=True)
    rundir.write_config(run, load_recipe(None, ["probe.warmup_steps=1"]))
    pd.DataFrame({"timing_s/step": steps}).to_parquet(run / rundir.STEPS)
    rundir.write_summary(run, {"status": "ok", "wall_s": wall, "compile_cache/inductor": cache,
                               field: key})


def test_the_share_outside_steady_steps_and_the_same_had_every_probe_started_cold(tmp_path, capsys):
    runs = tmp_path / "search" / "runs"
    # cold: 100 s, steady steps 3 x 1 s past its warm-up step -> 97 s outside
    _probe(runs, "a-cold", wall=100.0, steps=[50.0, 1.0, 1.0, 1.0], cache="miss", key="k1")
    # warm, same start (an older summary names it startup/shape_key): 40 s, 37 s outside; cold it would have paid
    # the cold probe's 97 s
    _probe(runs, "b-warm", wall=40.0, steps=[10.0, 1.0, 1.0, 1.0], cache="hit", key="k1", field="startup/shape_key")
    # warm, a start no cold probe shares: 30 s, 2 steady, 28 outside; cold: the largest cold probe's 197 s
    _probe(runs, "c-warm-other", wall=30.0, steps=[5.0, 1.0, 1.0], cache="hit", key="k2")
    # cold, another start: 200 s, 197 outside
    _probe(runs, "d-cold-other", wall=200.0, steps=[100.0, 1.0, 1.0, 1.0], cache="miss", key="k3")
    out = tmp_path / "share.json"
    assert search_fixed_share.main([str(tmp_path / "search"), "--out", str(out)]) == 0
    s = json.loads(out.read_text())["search"]
    assert (s["probes"], s["cold_probes"], s["warm_probes"]) == (4, 2, 2)
    assert s["outside_s"] == pytest.approx(97 + 37 + 28 + 197)
    assert s["share_outside"] == pytest.approx(359.0 / 370.0)
    # cold, the outside parts are 97, 97, 197 and 197 s beside 11 steady seconds
    assert s["share_if_all_cold"] == pytest.approx(588.0 / 599.0)
    # on one machine as it ran: no cold probe repeats an earlier probe's start
    assert s["share_if_one_machine"] == pytest.approx(s["share_outside"])
    assert "4 probes (2 cold, 2 warm)" in capsys.readouterr().out


def test_a_cold_probe_repeating_an_earlier_start_is_charged_the_warm_start_on_one_machine(tmp_path):
    runs = tmp_path / "runs"
    _probe(runs, "a-cold", wall=100.0, steps=[50.0, 1.0, 1.0, 1.0], cache="miss", key="k1")   # 97 outside
    _probe(runs, "b-warm", wall=40.0, steps=[10.0, 1.0, 1.0, 1.0], cache="hit", key="k1")    # 37 outside
    # the study moved to a fresh machine: the same start cold again, 120 s, 117 outside; one machine: the warm 37
    _probe(runs, "c-cold-again", wall=120.0, steps=[60.0, 1.0, 1.0, 1.0], cache="miss", key="k1")
    # a start no earlier probe made: cold on any machine, 80 s, 77 outside
    _probe(runs, "d-cold-new", wall=80.0, steps=[40.0, 1.0, 1.0, 1.0], cache="miss", key="k2")
    s = search_fixed_share.share([search_fixed_share.probe_row(d) for d in sorted(runs.iterdir())])
    assert s["share_outside"] == pytest.approx((97 + 37 + 117 + 77) / 340.0)
    assert s["share_if_one_machine"] == pytest.approx((97 + 37 + 37 + 77) / (340.0 - 117 + 37))


def test_a_directory_without_finished_probes_is_one_sentence_and_exit_2(tmp_path, capsys):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert search_fixed_share.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no probe with a finished record" in err and err.count("\n") == 1
