"""The cost model as a search meets it: each trial's probe predicted before it ran, from the trials probed before it.

For each trial of a search whose probe ended ok, in trial order, the cost model predicts the trial's configuration
(its probe's config.yaml) twice: uncalibrated, and calibrated on the ok probes of the trials numbered below it (what
the search had measured when it chose the trial; ``tunekit estimate --runs`` fits the same way). Each prediction's
steady step and phases are set against the probe's steady medians: error = (predicted - measured) / measured.

    PYTHONPATH=. python3 benchmarks/costmodel_in_search.py SEARCH_DIR --profile h200 --out T.json

SEARCH_DIR holds the search's search.json and its probes' run directories under runs/ (what smollm2_search.sh
packs). Probes of the same configuration as an earlier one (a duplicate trial) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tunekit import metrics  # noqa: E402
from tunekit.estimate.costmodel import predict  # noqa: E402
from tunekit.estimate.costmodel.calibrate import calibrate  # noqa: E402
from tunekit.estimate.profiles import load_profile  # noqa: E402
from tunekit.rundir import read_config, read_summary  # noqa: E402
from tunekit.runners import resolve_training  # noqa: E402


def _err(pred: float, measured: float) -> float:
    return round((pred - measured) / measured, 3)


def rows(search_dir: Path, profile_name: str) -> list[dict]:
    profile = load_profile(profile_name)
    trials = json.loads((search_dir / "search.json").read_text())["trials"]
    ok = [(t, search_dir / "runs" / Path(t["run_dir"]).name) for t in trials
          if t["status"] == "ok" and t.get("run_dir") and not t.get("duplicate_of")]
    out, earlier = [], []
    for t, run in ok:
        summary = read_summary(run) or {}
        steady = summary.get("steady") or {}
        recipe = read_config(run)
        row = {"trial": t["number"], "runner": recipe.runner, "machine": summary.get("machine/id"),
               "measured_step_s": round(float(steady[metrics.TIMING_STEP]), 4)}
        for kind, cal in (("uncalibrated", None), ("calibrated", calibrate(earlier, resolve=resolve_training) if earlier else None)):
            if kind == "calibrated" and cal is None:
                continue
            p = predict(recipe, profile, cal, resolve=resolve_training)
            phases = {x.name: round(x.seconds, 4) for x in p.phases}
            measured = {n: float(steady[metrics.timing(n)]) for n in phases if steady.get(metrics.timing(n))}
            worst = max(measured, key=lambda n: abs(phases[n] - measured[n])) if measured else None  # in seconds
            row[kind] = {"step_s": round(p.step_s, 4), "error": _err(p.step_s, row["measured_step_s"]),
                         "phases": {n: [phases[n], round(measured[n], 4)] for n in measured},
                         "worst_phase": worst, "worst_phase_error": _err(phases[worst], measured[worst]) if worst else None,
                         **({"from_trials": [x["trial"] for x in out]} if cal is not None else {})}
        out.append(row)
        earlier.append(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("search_dir", type=Path)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    res = rows(args.search_dir, args.profile)
    args.out.write_text(json.dumps({"profile": args.profile, "trials": res}, indent=1))
    for r in res:
        cal = r.get("calibrated") or {}
        print(f"trial {r['trial']:>2} {r['runner']:8s} measured {r['measured_step_s']:.3f} s  uncalibrated "
              f"{r['uncalibrated']['step_s']:.3f} ({r['uncalibrated']['error']:+.1%})"
              + (f"  calibrated on {cal['from_trials']}: {cal['step_s']:.3f} ({cal['error']:+.1%}, worst "
                 f"{cal['worst_phase']} {cal['worst_phase_error']:+.0%})" if cal else ""))


if __name__ == "__main__":
    main()
