"""The cost model as a search meets it: each trial's probe predicted before it ran, from the trials probed before it.

For each trial of a search whose probe ended ok, in trial order, the cost model predicts the trial's configuration
(its probe's config.yaml) twice: uncalibrated, and calibrated on the ok probes of the trials numbered below it (what
the search had measured when it chose the trial; ``tunekit estimate --runs`` fits the same way). Each prediction's
steady step and phases are set against the probe's steady medians: error = (predicted - measured) / measured.

    PYTHONPATH=. python3 benchmarks/costmodel_in_search.py SEARCH_DIR --profile h200 --out T.json [--sampled-tokens X]

With ``--sampled-tokens``, a third prediction, uncalibrated but charging responses of X tokens (the initial policy's
length as ``tunekit estimate --sample-responses`` finds it before any probe), is set against the steady median, against
the probe's first steady steps (:data:`EARLY_STEPS`), whose responses are still the initial policy's length, and
against the mean of its steps after the first (what its steps cost in all, while training shortened the responses).

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
from tunekit.estimate.costmodel.calibrate import ResponseLength, calibrate  # noqa: E402
from tunekit.estimate.profiles import load_profile  # noqa: E402
from tunekit.rundir import read_config, read_steps, read_summary  # noqa: E402
from tunekit.runners import runner_for  # noqa: E402

EARLY_STEPS = 5
"""The first steady steps, set against a prediction at the initial policy's response length."""


def _err(pred: float, measured: float) -> float:
    return round((pred - measured) / measured, 3)


def early(run: Path, summary: dict) -> tuple[float, float, float]:
    """The median step time and response length over the probe's first :data:`EARLY_STEPS` steady steps, and the
    mean step time over its steps after the first."""
    steps = read_steps(run)
    first = steps[steps["step"] >= summary.get("steady_from_step", 1)].head(EARLY_STEPS)
    mean = float(steps[steps["step"] >= 1][metrics.TIMING_STEP].mean())
    return float(first[metrics.TIMING_STEP].median()), float(first[metrics.RESPONSE_LENGTH_MEAN].median()), mean


def rows(search_dir: Path, profile_name: str, sampled_tokens: float | None = None) -> list[dict]:
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
        sampled = ResponseLength(sampled_tokens, "given") if sampled_tokens else None
        kinds = [("uncalibrated", None, None), *([("sampled", None, sampled)] if sampled else []),
                 *([("calibrated", calibrate(earlier, runners=runner_for), None)] if earlier else [])]
        for kind, cal, length in kinds:
            p = predict(recipe, profile, cal, runners=runner_for, sampled=length)
            phases = {x.name: round(x.seconds, 4) for x in p.phases}
            measured = {n: float(steady[metrics.timing(n)]) for n in phases if steady.get(metrics.timing(n))}
            worst = max(measured, key=lambda n: abs(phases[n] - measured[n])) if measured else None  # in seconds
            row[kind] = {"step_s": round(p.step_s, 4), "error": _err(p.step_s, row["measured_step_s"]),
                         "phases": {n: [phases[n], round(measured[n], 4)] for n in measured},
                         "worst_phase": worst, "worst_phase_error": _err(phases[worst], measured[worst]) if worst else None,
                         **({"from_trials": [x["trial"] for x in out]} if cal is not None else {})}
            if kind == "sampled":
                step_s, tokens, mean_s = early(run, summary)
                row[kind] |= {"early_step_s": round(step_s, 4), "early_response_tokens": round(tokens, 2),
                              "early_error": _err(p.step_s, step_s), "mean_step_s": round(mean_s, 4),
                              "mean_error": _err(p.step_s, mean_s)}
        out.append(row)
        earlier.append(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("search_dir", type=Path)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sampled-tokens", type=float, help="the initial policy's mean response length, as "
                    "`tunekit estimate --sample-responses` found it")
    args = ap.parse_args()
    res = rows(args.search_dir, args.profile, args.sampled_tokens)
    args.out.write_text(json.dumps({"profile": args.profile, "sampled_tokens": args.sampled_tokens, "trials": res},
                                   indent=1))
    for r in res:
        cal = r.get("calibrated") or {}
        print(f"trial {r['trial']:>2} {r['runner']:8s} measured {r['measured_step_s']:.3f} s  uncalibrated "
              f"{r['uncalibrated']['step_s']:.3f} ({r['uncalibrated']['error']:+.1%})"
              + (f"  calibrated on {cal['from_trials']}: {cal['step_s']:.3f} ({cal['error']:+.1%}, worst "
                 f"{cal['worst_phase']} {cal['worst_phase_error']:+.0%})" if cal else "")
              + (f"  sampled: {r['sampled']['step_s']:.3f} ({r['sampled']['error']:+.1%}; first steps "
                 f"{r['sampled']['early_step_s']:.3f} s at {r['sampled']['early_response_tokens']:.3g} tokens: "
                 f"{r['sampled']['early_error']:+.1%}; mean step {r['sampled']['mean_step_s']:.3f} s: "
                 f"{r['sampled']['mean_error']:+.1%})" if "sampled" in r else ""))


if __name__ == "__main__":
    main()
