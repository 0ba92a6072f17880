"""Regenerate the example report under reports/ from the current code: a short search, then its report.

Runs ``tunekit search`` on the embedded default (recipe ``tiny-ppo``, CPU, about two
minutes on 2 cores) into ``search-out/example-cpu`` (git-ignored, replaced each time)
and writes ``reports/cpu-search-example.html`` from it. Refuses to write the example
when the installed plotly.py does not match the vendored plotly.js basic bundle (the
report would inline the 4.8 MB full bundle instead).

    python scripts/make_example_reports.py
    python scripts/make_example_reports.py --report-only      # only the HTML again, from the last search's records
    python scripts/make_example_reports.py --recipe tiny-h200 --trials 10 --html reports/gpu-search-h200.html   # on a GPU machine
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from tunekit.report import build_report  # noqa: E402
from tunekit.report.plotlyjs import BUNDLE_VERSION, plotly_js  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="tiny-ppo", help="Recipe with a search: section (default: the embedded default).")
    ap.add_argument("--trials", type=int, default=8, help="Trials of the search (default 8: about two minutes on 2 CPU cores).")
    ap.add_argument("--budget-yuan", default="200", help="The search's budget (default 200; the CPU profile spends fractions of a yuan).")
    ap.add_argument("--work", default="search-out/example-cpu", help="Search output directory, relative to the checkout; replaced.")
    ap.add_argument("--html", default="reports/cpu-search-example.html", help="The example report to write, relative to the checkout.")
    ap.add_argument("--report-only", action="store_true", help="Skip the search: rebuild the HTML from the records in --work.")
    args = ap.parse_args()

    _, bundle = plotly_js()
    if "basic" not in bundle:
        sys.exit(f"the installed plotly.py draws with {bundle}, not the vendored basic bundle {BUNDLE_VERSION}: "
                 "vendor the matching npm plotly.js-basic-dist-min first (see tunekit/report/plotlyjs.py).")
    os.chdir(ROOT)  # relative paths only: they end up in the page
    work = Path(args.work)
    t0 = time.monotonic()
    if not args.report_only:
        shutil.rmtree(work, ignore_errors=True)
        cmd = [sys.executable, "-m", "tunekit", "search", "--recipe", args.recipe, "--budget-yuan", args.budget_yuan,
               "--trials", str(args.trials), "--out", str(work)]
        print("$", " ".join(cmd[1:]), flush=True)
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run(cmd, env=env)
    if not (work / "search.json").exists():
        sys.exit(f"{work / 'search.json'} does not exist: the search wrote none; nothing to report.")
    out = build_report([work], Path(args.html))
    print(f"{out}: {out.stat().st_size / 2**20:.2f} MiB ({bundle}); search and report took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
