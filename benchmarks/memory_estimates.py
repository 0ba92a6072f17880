"""The memory estimate against the measured peak over probes already run: every run directory under the given folders.

    python3 benchmarks/memory_estimates.py DIR... --out "$OUT"

Each probe on a GPU records, in its ``summary.json``, the estimate of the fullest GPU's peak
(``memory/estimate_gb``, from ``tunekit.estimate.memory`` before launch) beside NVML's peak on that GPU
(``memory/measured_gb``, every process) and their relative error. This collects them from any search
output or runs directory (probes that ended without a measured peak are listed, not counted) and writes
``OUT/memory_estimates.json`` (one table for benchmarks/collect.py) and prints it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tunekit import rundir  # noqa: E402


def rows(folders: list[Path]) -> list[dict]:
    """One row per run directory holding a summary with a memory estimate."""
    out = []
    for run in sorted({d for f in folders for d in rundir.find_run_dirs(f)}):
        s = rundir.read_summary(run) or {}
        if s.get("memory/estimate_gb") is None:
            continue
        out.append({"run": run.name, "recipe": s.get("recipe"), "status": s.get("status"),
                    "gpus": s.get("gpus_held"), "estimate_gb": s["memory/estimate_gb"],
                    "measured_gb": s.get("memory/measured_gb"), "error": s.get("memory/estimate_error")})
    return out


def table(found: list[dict]) -> dict:
    """Error statistics over the probes that ran to their end. A probe that ran out of memory measured the peak
    before the allocation that failed, a lower bound of what it needed: it is listed apart, with whether its
    estimate was over the card (the verdict would have skipped it)."""
    errors = [r["error"] for r in found if r["error"] is not None and r["status"] != "oom"]
    worst = max(errors, key=abs) if errors else None
    oom = [{"run": r["run"], "estimate_gb": r["estimate_gb"], "measured_gb": r["measured_gb"]} for r in found
           if r["status"] == "oom"]
    return {"rows": found, "n": len(errors), "median_error": statistics.median(errors) if errors else None,
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None, "worst_error": worst,
            "out_of_memory": oom}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="search output or runs directories")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t = table(rows(args.folders))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory_estimates.json").write_text(json.dumps(t, indent=1))
    for r in t["rows"]:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        print(f"{r['run']:50s} {r['status']:8s} gpus {r['gpus']}  estimate {r['estimate_gb']:.2f}  measured {r['measured_gb']}  {err}")
    if t["n"]:
        print(f"{t['n']} probes: median error {t['median_error']:+.1%}, median |error| {t['median_abs_error']:.1%}, "
              f"worst {t['worst_error']:+.1%}")
    for r in t["out_of_memory"]:
        print(f"out of memory, not counted: {r['run']}: estimated {r['estimate_gb']:.1f} GiB, "
              f"{r['measured_gb'] or 0:.1f} GiB in use when an allocation failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
