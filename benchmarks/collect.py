"""File a benchmark's result table under the claim it supports, in benchmarks/results/<claim>.json.

    python3 benchmarks/collect.py CLAIM RESULT.json... --machine nvidia-h200-x2 [--date 2026-11-30] [--note TEXT]

A benchmark script (trl_grpo.py, update_bench.py, matrix.py, rollout_backends.py, ...)
writes its table as JSON into its --out directory, beside the run directories and logs it made. Only the
table is kept in the repository: each call appends one entry (date, machine kind, source file name, note,
the table itself) to the claim's file, so that every figure on benchmarks/README.md can be traced to the
numbers it was read from. Paths into the output directory are written as ``$OUT/...``. The raw output
(run directories, step records, logs) stays where the benchmark wrote it.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_ABS_PATH = re.compile(r"(?<![\w$])/(?:tmp|work|root|home)/[^\s\"',;]*")


def scrub(value):
    """The table with absolute paths (the output directory, the checkout) replaced by ``$OUT/<last part>``."""
    if isinstance(value, str):
        return _ABS_PATH.sub(lambda m: "$OUT/" + Path(m.group(0)).name if "/runs/" in m.group(0) else "$OUT", value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def dumps(entries: list) -> str:
    """One compact JSON entry per line: valid JSON that diffs entry by entry."""
    return "[\n" + ",\n".join(json.dumps(e, separators=(",", ":")) for e in entries) + "\n]\n"


def entry(path: Path, *, machine: str, date: str | None, note: str) -> dict:
    data = json.loads(path.read_text())
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    date = date or str(meta.get("date", ""))[:10]
    if not date:
        raise SystemExit(f"{path}: the table carries no date; pass --date YYYY-MM-DD")
    return {"date": date, "machine": machine, "source": path.name, "note": note, "table": scrub(data)}


def collect(claim: str, paths: list[Path], *, machine: str, date: str | None = None, note: str = "",
            results: Path = RESULTS) -> Path:
    """Append one entry per table to results/<claim>.json (an entry equal to one already there is not repeated)."""
    out = results / f"{claim}.json"
    entries = json.loads(out.read_text()) if out.exists() else []
    for p in paths:
        e = entry(p, machine=machine, date=date, note=note)
        if e not in entries:
            entries.append(e)
    results.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(entries))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("claim", help="results file stem: rollout_backends, trl_grpo, update_mfu, ...")
    ap.add_argument("tables", nargs="+", type=Path, help="the JSON tables a benchmark script wrote")
    ap.add_argument("--machine", required=True, help="machine kind, e.g. nvidia-h200-x2 or cpu-2core")
    ap.add_argument("--date", help="YYYY-MM-DD when the table has no meta.date")
    ap.add_argument("--note", default="", help="what this table shows that its neighbours do not")
    a = ap.parse_args()
    print(collect(a.claim, a.tables, machine=a.machine, date=a.date, note=a.note))


if __name__ == "__main__":
    main()
