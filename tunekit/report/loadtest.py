"""The report's load-test section: each ``loadtest.json``'s curves (QPS and median latency against concurrency),
beside the probes of the same rollout configuration (same model, same engine knobs), and whether ranking the
configurations by load-test QPS agrees with ranking them by their probes' generation-phase times.

:func:`curves` and :func:`pairs` are pure tables (of the records :func:`tunekit.report.load.read_loadtests` read); :func:`curve_figure` draws; :func:`loadtest_section` writes HTML.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunekit.config import RolloutConfig, serving_key
from tunekit.report.figures import CURVE_SYMBOLS, PALETTE, esc, rounded
from tunekit.report.html import fmt, section
from tunekit.report.load import Probe

GEN = "timing_s/gen"


def label(record: dict[str, Any]) -> str:
    """A load test's name: its directory."""
    return Path(record["_path"]).parent.name


def curves(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per load test and concurrency level: ``label``, ``concurrency``, ``qps``, ``latency_ms_p50``,
    ``tokens_per_s``, ``failed``."""
    rows = [{"label": label(r), "concurrency": row.get("concurrency"), "qps": row.get("qps"),
             "latency_ms_p50": row.get("latency_ms_p50"), "tokens_per_s": row.get("tokens_per_s"),
             "failed": row.get("failed")}
            for r in records for row in r["rows"]]
    return pd.DataFrame(rows, columns=["label", "concurrency", "qps", "latency_ms_p50", "tokens_per_s", "failed"])


def _probe_engine(p: Probe) -> tuple | None:
    return serving_key((p.config.get("system") or {}).get("rollout"), p.config.get("model"))


def pairs(records: list[dict[str, Any]], probes: list[Probe]) -> pd.DataFrame:
    """One row per load test: ``label``, ``verdict``, ``qps`` at its pass line's concurrency, ``latency_ms_p50`` at
    concurrency 1, the ``probes`` of the same rollout configuration and their median ``gen_s`` (the median over them
    of each probe's steady median generation time; None without such probes)."""
    rows = []
    for r in records:
        at = (r.get("pass_line") or {}).get("at_concurrency")
        by_level = {row.get("concurrency"): row for row in r["rows"]}
        target = r.get("target") or {}
        key = serving_key(target.get("rollout"), target.get("policy"))
        same = [p for p in probes if key is not None and _probe_engine(p) == key]
        gens = [g for p in same if isinstance(g := (p.summary.get("steady") or {}).get(GEN), (int, float))]
        rows.append({"label": label(r), "verdict": r.get("verdict"), "qps": (by_level.get(at) or {}).get("qps"),
                     "latency_ms_p50": (by_level.get(1) or {}).get("latency_ms_p50"),
                     "probes": [p.id for p in same], "gen_s": float(pd.Series(gens).median()) if gens else None})
    return pd.DataFrame(rows, columns=["label", "verdict", "qps", "latency_ms_p50", "probes", "gen_s"])


def agreement(table: pd.DataFrame) -> str | None:
    """Whether ranking by load-test QPS (higher first) agrees with ranking by the probes' generation time (shorter
    first), over the configurations that have both; None with fewer than two."""
    both = table.dropna(subset=["qps", "gen_s"])
    both = both[both["probes"].map(len) > 0]
    if len(both) < 2:
        return None
    qps, gen = list(both["qps"]), list(both["gen_s"])
    n = len(both)
    compared = [(i, j) for i in range(n) for j in range(i + 1, n) if qps[i] != qps[j] and gen[i] != gen[j]]
    same = sum((qps[i] > qps[j]) == (gen[i] < gen[j]) for i, j in compared)
    if not compared:
        return f"The {n} configurations tie on QPS or on generation time: no ranking to compare."
    verb = "agrees with" if same == len(compared) else "disagrees with"
    return (f"Ranking by load-test QPS {verb} ranking by the probes' generation-phase time: {same} of {len(compared)} "
            f"pairs of configurations in the same order ({n} configurations with both).")


def curve_figure(df: pd.DataFrame) -> go.Figure:
    """QPS (left) and median latency (right) against concurrency, one line per load test."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("QPS", "latency p50 (ms)"))
    for i, (name, g) in enumerate(df.sort_values("concurrency").groupby("label", sort=False)):
        style = dict(color=PALETTE[i % len(PALETTE)])
        for col, y in ((1, "qps"), (2, "latency_ms_p50")):
            fig.add_trace(go.Scatter(x=list(g["concurrency"]), y=rounded(g[y]), name=esc(name), legendgroup=esc(name),
                                     showlegend=col == 1, mode="lines+markers", line=style,
                                     marker=dict(symbol=CURVE_SYMBOLS[i % len(CURVE_SYMBOLS)])), row=1, col=col)
    fig.update_xaxes(type="log", title_text="requests in flight")
    fig.update_layout(template="plotly_white", height=420, margin=dict(l=60, r=20, t=80, b=50),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.12, yanchor="bottom"))
    return fig


def loadtest_section(records: list[dict[str, Any]], probes: list[Probe], figure_html) -> str:
    """The section, or "" when there is no load test; ``figure_html(fig, name)`` embeds a figure."""
    if not records:
        return ""
    table = pairs(records, probes)
    rows = "".join(
        f"<tr><td>{escape(r.label)}</td><td class=\"num\">{fmt(r.qps)}</td><td class=\"num\">{fmt(r.latency_ms_p50)}</td>"
        f"<td>{escape(', '.join(r.probes) or '–')}</td><td class=\"num\">{fmt(r.gen_s)}</td>"
        f"<td>{escape(str(r.verdict or '–'))}</td></tr>" for r in table.itertuples())
    head = ("<tr><th>load test</th><th>QPS at the pass line's concurrency</th><th>latency p50 ms, one request</th>"
            "<th>probes of the same rollout configuration</th><th>their gen s (median)</th><th>verdict</th></tr>")
    said = agreement(table)
    body = (figure_html(curve_figure(curves(records)), "loadtest")
            + (f'<p class="note">{escape(said)}</p>' if said else "")
            + f'<div class="tablewrap"><table class="sortable"><thead>{head}</thead><tbody>{rows}</tbody></table></div>')
    note = ("<code>tunekit loadtest</code>: requests in flight against QPS and median latency. A probe is of the same "
            "rollout configuration when its model and engine knobs (" + ", ".join(RolloutConfig.ENGINE_FIELDS)
            + ") are the load test's own.")
    return section("loadtest", "Rollout engine under load", body, note)
