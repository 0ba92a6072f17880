"""A load test's rows (one per concurrency level), its pass line, and ``loadtest.json``.

Row keys: ``concurrency``, ``requests`` (measured), ``failed``, ``qps`` (completed requests per second),
``tokens_per_s`` (completion tokens per second), ``latency_ms_p50`` / ``_p95`` / ``_p99`` (send to last byte, over
the completed requests), ``ttft_ms_p50`` (time to the first streamed token; None unstreamed), ``pass`` (the pass
line's verdict where the row is read by it, else None) and ``error`` (why requests failed, or None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunekit.config import LoadtestConfig
from tunekit.loadtest.client import Outcome

PERCENTILES = (50, 95, 99)


def _ms(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile in milliseconds (linear interpolation, as ``vllm bench serve`` computes it)."""
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else None


def level_row(concurrency: int, outcomes: Sequence[Outcome], duration_s: float) -> dict[str, Any]:
    """One level's row from its measured requests and the seconds they took together."""
    done = [o for o in outcomes if o.error is None]
    failed = [o for o in outcomes if o.error is not None]
    lat = [o.latency_s for o in done]
    ttft = [o.ttft_s for o in done if o.ttft_s is not None]
    counted = all(o.tokens is not None for o in done)
    row: dict[str, Any] = {
        "concurrency": concurrency, "requests": len(outcomes), "failed": len(failed),
        "qps": len(done) / duration_s if done and duration_s > 0 else None,
        "tokens_per_s": sum(o.tokens for o in done) / duration_s if done and counted and duration_s > 0 else None,
    }
    row.update({f"latency_ms_p{q}": _ms(lat, q) for q in PERCENTILES})
    row["ttft_ms_p50"] = _ms(ttft, 50) if ttft and len(ttft) == len(done) else None
    row["error"] = failed_sentence(len(failed), len(outcomes), failed[0].error) if failed else None
    return row


def failed_sentence(failed: int, requests: int, first: str | None) -> str:
    return f"{failed} of {requests} requests failed" + (f"; the first: {first}" if first else "")


@dataclass
class Loadtest:
    """A load test as it goes: the rows measured so far, and why it stopped early (None: every level ran)."""

    config: LoadtestConfig
    target: dict[str, Any]
    """What was loaded: ``url`` (never with a key), ``model``, ``client``, and the rollout knobs when tunekit
    started the server."""
    sampling: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None

    def add(self, row: dict[str, Any]) -> None:
        row["pass"] = row_passes(row, self.config)
        self.rows.append(row)

    @property
    def complete(self) -> bool:
        return self.stopped is None and {r["concurrency"] for r in self.rows} >= set(self.config.levels)

    @property
    def passed(self) -> bool:
        """The pass line: both of its rows measured, without failed requests, and within their limits."""
        judged = [r["pass"] for r in self.rows if r["pass"] is not None]
        needed = {1, self.config.at_concurrency}
        return self.complete and needed <= {r["concurrency"] for r in self.rows} and bool(judged) and all(judged)

    def verdict(self) -> str:
        """One sentence: pass or fail and why."""
        c = self.config
        line = (f"single-request latency p50 <= {c.max_latency_ms:g} ms and >= {c.min_qps:g} QPS at concurrency "
                f"{c.at_concurrency}")
        if self.stopped is not None:
            return f"incomplete: {self.stopped} (rows measured before it are kept)"
        if self.passed:
            return f"pass: {line}"
        why = [r["error"] or _miss(r, c) for r in self.rows if r["pass"] is False]
        return f"fail: {line} not met ({'; '.join(why)})"

    def record(self) -> dict[str, Any]:
        """What ``loadtest.json`` holds."""
        c = self.config
        return {"target": self.target, "sampling": self.sampling,
                "pass_line": {"max_latency_ms": c.max_latency_ms, "min_qps": c.min_qps, "at_concurrency": c.at_concurrency},
                "rows": self.rows, "complete": self.complete, "stopped": self.stopped, "pass": self.passed,
                "verdict": self.verdict()}


def row_passes(row: dict[str, Any], c: LoadtestConfig) -> bool | None:
    """The pass line's verdict on a row: latency at concurrency 1, QPS at ``at_concurrency``; None for a row the
    line does not read. A row with failed requests fails."""
    checks = []
    if row["concurrency"] == 1:
        checks.append(row["latency_ms_p50"] is not None and row["latency_ms_p50"] <= c.max_latency_ms)
    if row["concurrency"] == c.at_concurrency:
        checks.append(row["qps"] is not None and row["qps"] >= c.min_qps)
    if not checks:
        return None
    return all(checks) and not row["failed"]


def _miss(row: dict[str, Any], c: LoadtestConfig) -> str:
    parts = []
    if row["concurrency"] == 1:
        parts.append(f"latency p50 {_num(row['latency_ms_p50'])} ms at concurrency 1")
    if row["concurrency"] == c.at_concurrency:
        parts.append(f"{_num(row['qps'])} QPS at concurrency {c.at_concurrency}")
    return ", ".join(parts)


def _num(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.4g}"
