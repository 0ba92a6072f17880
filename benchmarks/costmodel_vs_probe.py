"""The cost model's uncalibrated prediction of a recipe, phase by phase, against probes of it that ran.

Reads each probe's steady phase medians (``summary.json``'s ``steady``; its ``steps.parquet`` from
``steady_from_step`` where the summary has none), predicts the recipe on the profile with no calibration, and
prints one row a phase: predicted, each probe's measured time, the error against each, and the terms that set the
prediction (largest first).

    PYTHONPATH=. python3 benchmarks/costmodel_vs_probe.py --recipe smollm2-arith --set system.device=cuda \\
        --profile h200 --probes RUN_DIR [RUN_DIR ...] --out $OUT

Writes OUT/costmodel_vs_probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import pandas as pd  # noqa: E402

from tunekit.config import load_recipe  # noqa: E402
from tunekit.estimate.costmodel import predict  # noqa: E402
from tunekit.estimate.profiles import load_profile  # noqa: E402
from tunekit.runners import runner_for  # noqa: E402
from tunekit.workload.pretrained import resolve_model  # noqa: E402


def steady_phases(run: Path) -> dict[str, float]:
    """A probe's steady median seconds by phase name (``step`` included)."""
    summary = json.loads((run / "summary.json").read_text())
    steps = pd.read_parquet(run / "steps.parquet")
    steps = steps[steps["step"] >= summary.get("steady_from_step", 1)]
    return {c.split("/", 1)[1]: float(steps[c].median()) for c in steps.columns if c.startswith("timing_s/")}


def compare(recipe: str, sets: list[str], profile: str, probes: list[Path]) -> dict:
    r = resolve_model(load_recipe(recipe, sets))
    p = predict(r, load_profile(profile), runners=runner_for)
    measured = {run.name: steady_phases(run) for run in probes}
    rows = {x.name: {"pred_s": round(x.seconds, 4), "bound": getattr(x, "bound", ""),
                     "terms": {n: round(v, 4) for n, v in getattr(x, "terms", ())}} for x in p.phases}
    rows["step"] = {"pred_s": round(p.step_s, 4)}
    for name in sorted({k for m in measured.values() for k in m} - set(rows)):
        rows[name] = {"pred_s": 0.0, "note": "not modelled"}
    for name, row in rows.items():
        for probe, m in measured.items():
            if name in m:
                row[probe] = round(m[name], 4)
                row[f"err/{probe}"] = round((row["pred_s"] - m[name]) / m[name], 3)
    return {"recipe": recipe, "sets": sets, "profile": profile, "phases": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--probes", type=Path, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    res = compare(args.recipe, args.sets, args.profile, args.probes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "costmodel_vs_probe.json").write_text(json.dumps(res, indent=1))
    for name, row in res["phases"].items():
        errs = "  ".join(f"{k}: {v}" for k, v in row.items() if k not in ("terms", "bound", "note"))
        terms = ", ".join(f"{n} {v}" for n, v in list(row.get("terms", {}).items())[:3])
        print(f"{name:15s} {errs}  {row.get('bound', '')} {terms}")


if __name__ == "__main__":
    main()
