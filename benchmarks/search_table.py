"""A search's compact result table: the answer's lines and each probe's record, what the results page is built from.

    python3 benchmarks/search_table.py SEARCH_DIR --out TABLE.json [--command TEXT]

Reads SEARCH_DIR/search.json and each probe's run directory under it (summary.json, config.yaml, steps.parquet)
and writes, per probe: its trial and settings, status, steps, wall time, reward over the first and last ten steps
and at every step, start-up and first-step parts, compile-cache outcome, memory estimate against the measured
peak, its price and projected run, the steady step and each phase's steady time (the run's own medians), and the search's own projection (a trial
the search read as learning like another takes that one's curve). Beside them the search's time outside steady
steps (``search_fixed_share.py``). ``python3 benchmarks/collect.py smollm2_search TABLE.json ...`` files it.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_fixed_share import probe_row, share  # noqa: E402

from tunekit.rundir import read_steps, read_summary  # noqa: E402

KEEP = ("status", "reason", "steps", "wall_s", "reward_first10", "reward_last10", "startup_s", "memory/estimate_gb",
        "memory/measured_gb", "cost/probe_yuan", "cost/run_rule", "cost/target_steps", "cost/projected_yuan",
        "cost/priced_overhead_s", "cost/overhead_source")
PREFIXES = ("startup/", "first_step/", "compile/", "compile_cache/")


def _round(v):
    return round(v, 3) if isinstance(v, float) else v


def probe_record(trial: dict, run_dir: Path) -> dict:
    """One probe's compact record (``trial``: its entry in search.json)."""
    summary = read_summary(run_dir) or {}
    rec = {"trial": trial["number"], "probe": run_dir.name, "sets": trial.get("sets", [])}
    rec |= {k: _round(summary.get(k)) for k in KEEP if k in summary}
    rec |= {k: _round(v) for k, v in sorted(summary.items()) if k.startswith(PREFIXES)
            and not k.endswith(("/dir", "/start_key"))}
    steady = summary.get("steady") or {}  # the run's steady-step medians, past its warm-up
    if "timing_s/step" in steady:
        rec["steady_step_s"] = round(float(steady["timing_s/step"]), 3)
        rec["steady_phase_s"] = {k.split("/", 1)[1]: round(float(v), 3) for k, v in steady.items()
                                 if k.startswith("timing_s/") and k != "timing_s/step"}
    steps = read_steps(run_dir)
    if "reward/mean" in steps:
        rec["reward_per_step"] = [round(float(x), 3) for x in steps["reward/mean"]]
    rec |= {"search_projected_yuan": _round(trial.get("projected_yuan")), "search_run_rule": trial.get("run_rule"),
            "search_learning_of": trial.get("learning_of"), "search_verdict": trial.get("verdict")}
    return rec


def table(search_dir: Path, command: str) -> dict:
    result = json.loads((search_dir / "search.json").read_text())
    probes, rows = [], []
    for trial in result["trials"]:
        run_dir = search_dir / "runs" / Path(trial.get("run_dir") or "").name
        if trial.get("run_dir") and run_dir.is_dir():
            probes.append(probe_record(trial, run_dir))
            # a trial that reused an earlier trial's probe names its run directory again: one row per probe
            if all(r["probe"] != run_dir.name for r in rows) and (row := probe_row(run_dir)) is not None:
                rows.append(row)
    return {"meta": {"date": str(date.today()), "command": command}, "stop_reason": result.get("stop_reason"),
            "lines": result.get("reaches", {}).get("lines", []), "probes": probes,
            "fixed_share": {"rows": rows, "search": share(rows)} if rows else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("search_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="", help="the command that ran the search, for the table's meta")
    a = ap.parse_args(argv)
    if not (a.search_dir / "search.json").is_file():
        print(f"{a.search_dir}/search.json does not exist: give the directory a search wrote (tunekit search --out)",
              file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(table(a.search_dir, a.command), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
