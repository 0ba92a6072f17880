"""How much of a search's probe time went outside steady steps: start-up, the first steps' compile and capture,
teardown. Read from a search's (or any output directory's) run directories, after the fact.

    python3 benchmarks/search_fixed_share.py SEARCH_DIR [--out TABLE.json]

Per probe: its wall time (``wall_s``, launch to end), the seconds its steady steps took (``timing_s/step`` summed
over the steps past ``probe.warmup_steps``), the rest (``outside_s``), and whether its compile cache answered
(``compile_cache/inductor``: ``miss`` is a cold start). The search's share outside steady steps is the sum of
``outside_s`` over the sum of ``wall_s``.

Beside it, the same share as if no probe had found a warm cache (``share_if_all_cold``): each warm probe's
``outside_s`` replaced by the largest of the cold probes' of the same start (``startup/start_key``; an older
summary's ``startup/shape_key``), or of any cold probe where none shares its start. That is an estimate from the same search, not a second search: it says what
sharing the caches saved, on the probes this search ran.

And the share as if the search had run on one machine (``share_if_one_machine``): a search resumed on another
machine finds no cache there, so a probe whose start an earlier probe of the search had made can still start cold;
each such probe's ``outside_s`` is replaced by the largest of the warm probes' of the same start (unchanged where none
of its start ran warm). Also an estimate from the same probes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunekit.config import Recipe
from tunekit.rundir import SEARCH_RUNS, read_config, read_steps, read_summary

STEP = "timing_s/step"
COLD = "miss"
WARM = ("hit", "partial")


def probe_row(run_dir: Path) -> dict | None:
    """One probe's wall, steady and outside seconds, or None for a directory that holds no finished record."""
    summary = read_summary(run_dir)
    if not summary or summary.get("wall_s") is None:
        return None
    steps = read_steps(run_dir)
    warmup = _warmup(run_dir)
    steady = float(steps[STEP].iloc[warmup:].sum()) if STEP in steps else 0.0
    wall = float(summary["wall_s"])
    return {"probe": run_dir.name, "status": summary.get("status"), "cache": summary.get("compile_cache/inductor"),
            "start_key": summary.get("startup/start_key", summary.get("startup/shape_key")), "wall_s": wall, "steady_s": steady,
            "outside_s": max(0.0, wall - steady), "steps": int(len(steps))}


def _warmup(run_dir: Path) -> int:
    try:
        recipe: Recipe = read_config(run_dir)
    except Exception:  # a config this checkout cannot read: count every step after the first as steady
        return 1
    return recipe.probe.warmup_steps


def share(rows: list[dict]) -> dict:
    """The search's share outside steady steps, and the same share with every warm probe paying a cold start."""
    wall = sum(r["wall_s"] for r in rows)
    outside = sum(r["outside_s"] for r in rows)
    cold = [r for r in rows if r["cache"] == COLD]
    cold_outside = 0.0
    for r in rows:
        if r["cache"] == COLD or r["cache"] is None or not cold:
            cold_outside += r["outside_s"]
            continue
        same = [c["outside_s"] for c in cold if c["start_key"] == r["start_key"]] or [c["outside_s"] for c in cold]
        cold_outside += max(r["outside_s"], max(same))
    all_cold_wall = wall - outside + cold_outside
    one_outside = one_machine_outside(rows)
    one_wall = wall - outside + one_outside
    return {"probes": len(rows), "cold_probes": len(cold),
            "warm_probes": sum(r["cache"] in WARM for r in rows),
            "wall_s": wall, "outside_s": outside, "share_outside": outside / wall if wall else None,
            "share_if_all_cold": cold_outside / all_cold_wall if all_cold_wall else None,
            "share_if_one_machine": one_outside / one_wall if one_wall else None}


def one_machine_outside(rows: list[dict]) -> float:
    """The probes' seconds outside steady steps had the search run on one machine: a cold probe (in launch order,
    the run directories' names) whose start an earlier probe had made charged the largest warm ``outside_s`` of
    that start, where one of its start ran warm."""
    seen: set = set()
    total = 0.0
    for r in rows:
        spent = r["outside_s"]
        warm = [w["outside_s"] for w in rows if w["start_key"] == r["start_key"] and w["cache"] in WARM]
        if r["cache"] == COLD and r["start_key"] in seen and warm:
            spent = min(spent, max(warm))
        seen.add(r["start_key"])
        total += spent
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("search_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    a = ap.parse_args(argv)
    runs = a.search_dir / SEARCH_RUNS if (a.search_dir / SEARCH_RUNS).is_dir() else a.search_dir
    rows = [r for d in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))
            if (r := probe_row(d)) is not None]
    if not rows:
        print(f"{runs} holds no probe with a finished record (summary.json with wall_s); give a search's directory",
              file=sys.stderr)
        return 2
    table = {"rows": rows, "search": share(rows)}
    for r in rows:
        print(f"{r['probe']:<48} {r['status'] or '':<8} cache {r['cache'] or '-':<8} wall {r['wall_s']:8.1f} s  "
              f"steady {r['steady_s']:8.1f} s  outside {r['outside_s']:8.1f} s")
    s = table["search"]
    print(f"{s['probes']} probes ({s['cold_probes']} cold, {s['warm_probes']} warm): {s['outside_s']:.0f} of "
          f"{s['wall_s']:.0f} s outside steady steps ({s['share_outside']:.1%}); with every probe cold "
          f"{s['share_if_all_cold']:.1%}; on one machine {s['share_if_one_machine']:.1%}")
    if a.out is not None:
        a.out.write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
