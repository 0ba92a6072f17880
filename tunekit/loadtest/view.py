"""The load test in the terminal: one line per level as it ends, then the table and the pass line's verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunekit.loadtest.results import Loadtest

UNKNOWN = "unknown"
COLUMNS = (("concurrency", "concurrency"), ("requests", "requests"), ("failed", "failed"), ("qps", "QPS"),
           ("tokens_per_s", "tokens/s"), ("latency_ms_p50", "p50 ms"), ("latency_ms_p95", "p95 ms"),
           ("latency_ms_p99", "p99 ms"), ("ttft_ms_p50", "TTFT p50 ms"))


def _fmt(v: Any) -> str:
    if v is None:
        return UNKNOWN
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def level_line(row: dict[str, Any]) -> str:
    """One level as it ends: its concurrency, QPS and median latency, and failures if any."""
    line = (f"concurrency {row['concurrency']}: {_fmt(row['qps'])} QPS, {_fmt(row['tokens_per_s'])} tokens/s, "
            f"latency p50 {_fmt(row['latency_ms_p50'])} ms")
    return line + (f"; {row['error']}" if row.get("error") else "")


def print_loadtest(out: Console, test: Loadtest, path: Path) -> None:
    target = test.target
    t = Table(*(title for _, title in COLUMNS), "pass", title=f"load test of {target['model']} at {target['url']} "
              f"({target['client']})")
    for row in test.rows:
        verdict = {True: "[green]pass[/green]", False: "[red]fail[/red]", None: "-"}[row["pass"]]
        t.add_row(*(_fmt(row.get(key)) for key, _ in COLUMNS), verdict)
    out.print(t)
    for row in test.rows:
        if row.get("error"):
            out.print(f"concurrency {row['concurrency']}: {escape(row['error'])}", highlight=False, soft_wrap=True)
    colour = "green" if test.passed else "red"
    out.print(f"[{colour}]{escape(test.verdict())}[/{colour}]", highlight=False, soft_wrap=True)
    out.print(f"loadtest: {path}", highlight=False, soft_wrap=True)
