"""Plotly figures from the report's data tables; no numbers are computed here.

Every string that came from a user (recipe names, knob values, reasons, parameter
names) goes through :func:`esc` first: plotly draws pseudo-HTML in labels, and
decodes entities back to the literal text.
"""

from __future__ import annotations

import functools
import html
import json
import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunekit import metrics
from tunekit.report.data import OUTCOMES
from tunekit.report.series import PHASES

COLORS = {"feasible": "#2a9d8f", "within noise": "#e9c46a", "infeasible": "#f4a261", "ok": "#457b9d", "pruned": "#8e7cc3",
          "incomplete": "#adb5bd", "failed": "#d62828"}
SYMBOLS = {"feasible": "circle", "within noise": "circle-dot", "infeasible": "diamond", "ok": "circle", "pruned": "triangle-down",
           "incomplete": "square-open", "failed": "x"}
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
CURVE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star", "triangle-down", "hexagon")
COMM_COLORS = {"total": "#a8b3c4", "exposed": "#d1495b"}
"""Total communication in grey-blue, its exposed (not overlapped) part in red: never one colour for both."""
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac", "#eeca3b", "#393b79")
PHASE_COLORS = dict(zip((*PHASES, "other"), PALETTE))
SIG_DIGITS = 4


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def rounded(values: Any) -> list[float | None]:
    """Values to SIG_DIGITS significant digits (smaller JSON); NaN becomes None (a gap)."""
    out = []
    for v in values:
        v = float(v) if v is not None else math.nan
        out.append(None if not math.isfinite(v) else float(f"{v:.{SIG_DIGITS}g}"))
    return out


def _layout(fig: go.Figure, *, x: str, y: str, height: int = 420, **kw: Any) -> go.Figure:
    # the legend above the plot: below it, it collides with long or rotated category labels on narrow screens
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=80, b=50), showlegend=True,
                      xaxis_title=x, yaxis_title=y, legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"), **kw)
    return fig


def _hover(row: pd.Series, varying: list[str]) -> str:
    lines = [f"<b>{esc(row['label'])}</b> {esc(row['recipe'])}", esc(row["outcome"])]
    if row["category"] == "pruned":
        lines.append(f"stopped after {row['steps']:.0f} steps: cost and reward from those steps" if pd.notna(row.get("steps")) else "stopped early")
    for col, name, fmt in (("reward", "reward", ".3f"), ("projected_yuan", "projected ¥", ".4g"),
                           ("projected_gpu_hours", "GPU-hours", ".4g")):
        if pd.notna(row.get(col)):
            lines.append(f"{name}: {row[col]:{fmt}}")
    lines += [f"{esc(k.removeprefix('knob:'))} = {esc(row[k])}" for k in varying[:12] if k in row]
    return "<br>".join(lines)


def cost_reward(cr: dict[str, Any], varying: list[str], best: str | None, offpolicy: dict[str, str]) -> go.Figure:
    """Projected full-run yuan vs reward per probe; Pareto front; threshold line; off-policy probes ringed in red."""
    pts: pd.DataFrame = cr["points"]
    fig = go.Figure()
    for cat in COLORS:
        sub = pts[pts["category"] == cat]
        if len(sub):
            name = "pruned on cost (projected when stopped)" if cat == "pruned" else OUTCOMES[cat]
            # names beside the points (probes on one spot share a label), the details on hover
            fig.add_scatter(x=rounded(sub["projected_yuan"]), y=rounded(sub["reward"]), mode="markers+text", name=name,
                            marker=dict(color=COLORS[cat], symbol=SYMBOLS[cat], size=10, line=dict(width=1, color="#333")),
                            text=[esc(cr["labels"].get(lbl, "")) for lbl in sub["label"]], textposition="top center",
                            textfont=dict(size=10, color="#444"),
                            hovertext=[_hover(r, varying) for _, r in sub.iterrows()], hoverinfo="text")
    front = pts.set_index("label").loc[[f for f in cr["front"] if f in set(pts["label"])]]
    if len(front):
        fig.add_scatter(x=rounded(front["projected_yuan"]), y=rounded(front["reward"]), mode="lines+markers", name="cheapest for its reward",
                        line=dict(color="#555", dash="dot", shape="hv"), hoverinfo="skip",
                        marker=dict(size=16, symbol="circle-open", color="#555"))
    off = pts[pts["label"].isin(set(offpolicy))]
    if len(off):
        fig.add_scatter(x=rounded(off["projected_yuan"]), y=rounded(off["reward"]), mode="markers", name="off-policy",
                        marker=dict(size=20, symbol="circle-open", color=COLORS["failed"], line=dict(width=2.5)),
                        hovertext=[f"{esc(lbl)} off-policy: {esc(offpolicy[lbl])}" for lbl in off["label"]], hoverinfo="text")
    if best is not None and best in set(pts["label"]):
        b = pts[pts["label"] == best].iloc[0]
        (x,), (y,) = rounded([b["projected_yuan"]]), rounded([b["reward"]])  # where the marker is drawn
        fig.add_annotation(x=x, y=y, text="the answer" if cr.get("labels") else f"the answer, {esc(best)}",
                           showarrow=True, arrowhead=2, ax=50, ay=-35)
    if cr["threshold"] is not None:
        fig.add_hline(y=cr["threshold"], line=dict(color=COLORS["failed"], dash="dash"),
                      annotation_text=f"threshold {cr['threshold']:g}", annotation_position="top left")
    return _layout(fig, x="projected full-run cost (¥)", y="reward (mean of last steps)")


def phase_bars(df: pd.DataFrame) -> go.Figure:
    """Stacked median steady seconds per phase, one bar per configuration."""
    fig = go.Figure()
    for ph in (*PHASES, "other"):
        if ph in df and df[ph].fillna(0).any():
            fig.add_bar(x=list(df.index), y=rounded(df[ph]), name=ph, marker_color=PHASE_COLORS[ph])
    return _layout(fig, x="probe", y="median steady step time (s)", barmode="stack")


def comm_bars(df: pd.DataFrame) -> go.Figure:
    """Per configuration and phase: total communication (grey) with its exposed part (red, narrower) drawn over it."""
    x = [df["label"].astype(str).map(esc).tolist(), df["phase"].tolist()]
    fig = go.Figure()
    if df["total_s"].notna().any():
        fig.add_bar(x=x, y=rounded(df["total_s"]), name="total: all communication kernel time", width=0.8,
                    marker_color=COMM_COLORS["total"])
    fig.add_bar(x=x, y=rounded(df["exposed_s"]), name="exposed: not overlapped by compute", width=0.45,
                marker_color=COMM_COLORS["exposed"])
    return _layout(fig, x="probe / phase", y="communication per step (s)", barmode="overlay")


def memory_bars(df: pd.DataFrame) -> go.Figure:
    """Allocator peaks vs NVML peak per GPU, grouped per configuration."""
    fig = go.Figure()
    order = list(dict.fromkeys(df["label"]))
    styles = {"allocator allocated": ("#9ecae1", ""), "allocator reserved": ("#3182bd", "")}
    series = sorted(df["series"].unique(), key=lambda s: (not s.startswith("allocator"), s))
    for i, name in enumerate(series):
        sub = df[df["series"] == name].set_index("label").reindex(order)
        color, pattern = styles.get(name, (PALETTE[(i + 2) % len(PALETTE)], "/"))
        hover = [f"{esc(lbl)} {esc(name)}: {gb:.3g} GB<br>roles on GPU: {esc(r)}" if pd.notna(gb) else ""
                 for lbl, gb, r in zip(order, sub["gb"], sub["roles"].fillna(""))]
        fig.add_bar(x=order, y=rounded(sub["gb"]), name=esc(name), marker=dict(color=color, pattern_shape=pattern),
                    text=hover, hoverinfo="text", textposition="none")
    return _layout(fig, x="probe", y="peak memory (GB)", barmode="group")


def reward_curves(curves: dict[str, pd.DataFrame], highlight: list[str], threshold: float | None, window: int | None,
                  held_out: bool = False) -> go.Figure:
    """One curve per configuration (:func:`tunekit.report.series.per_configuration`): the mean over its seeds of the
    reward smoothed over the threshold window, with a band from its lowest to its highest seed; highlighted
    configurations in colour, each with its own dash and marker, the rest grey. The threshold is the red dashed line."""
    fig = go.Figure()
    shown_other = False
    for label, c in curves.items():
        if label in highlight:
            continue
        fig.add_scatter(x=rounded(c["step"]), y=rounded(c["smooth"]), mode="lines", name="other configurations",
                        legendgroup="other", showlegend=not shown_other, line=dict(color="#c8c8c8", width=1),
                        hovertext=esc(label), hoverinfo="text+y")
        shown_other = True
    for i, label in enumerate(h for h in highlight if h in curves):
        c, color, group = curves[label], PALETTE[i % len(PALETTE)], f"c{i}"
        seeds = int(c["seeds"].iloc[0]) if len(c) else 1
        if seeds > 1:  # the band: from the lowest seed up to the highest and back
            fig.add_scatter(x=rounded(list(c["step"]) + list(c["step"])[::-1]), y=rounded(list(c["high"]) + list(c["low"])[::-1]),
                            fill="toself", mode="lines", line=dict(width=0), fillcolor=color, opacity=0.18,
                            legendgroup=group, showlegend=False, hoverinfo="skip", name=f"{esc(label)} seeds")
        name = f"{esc(label)} (mean of {seeds} seeds)" if seeds > 1 else esc(label)
        fig.add_scatter(x=rounded(c["step"]), y=rounded(c["smooth"]), mode="lines+markers", name=name, legendgroup=group,
                        line=dict(color=color, width=2.5, dash=DASHES[i % len(DASHES)]),
                        marker=dict(symbol=CURVE_SYMBOLS[i % len(CURVE_SYMBOLS)], size=7, maxdisplayed=12),
                        hovertemplate=f"{esc(label)} step %{{x}}: %{{y}}<extra></extra>")
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color=COLORS["failed"], dash="dash"), annotation_text=f"threshold {threshold:g}",
                      annotation_position="top left")
        fig.add_scatter(x=[None], y=[None], mode="lines", name=f"threshold {threshold:g}",
                        line=dict(color=COLORS["failed"], dash="dash"), hoverinfo="skip")  # a legend entry for the line
    if held_out:
        return _layout(fig, x="steps trained", y="held-out reward (each evaluation)")
    span = f"mean of the last {window} steps" if window else "smoothed"
    return _layout(fig, x="step", y=f"reward ({span})")


def history(hist: pd.DataFrame) -> go.Figure:
    """Each trial at its projected cost, marked by outcome (pruned ones at their own probe's projection), and the best
    feasible so far. Trials without any projection are not drawn; the caption lists them."""
    fig = go.Figure()
    drawn = hist[hist["value"].notna()]
    finished = drawn[drawn["value_from"] == "objective"]["value"]
    # a trial stopped early is drawn at the chart's top when its bound lies above it: it does not stretch the axis
    top = 1.25 * float(finished.max()) if len(finished) else None
    if top is not None and (drawn["value"] > top).any():
        fig.update_yaxes(range=[0, 1.05 * top])
        drawn = drawn.assign(value=drawn["value"].clip(upper=top))
    for cat in COLORS:
        sub = drawn[drawn["category"] == cat]
        if not len(sub):
            continue
        text = [f"trial {n}" + (f" (same configuration as trial {d:.0f})" if pd.notna(d) else "") + f" · {esc(OUTCOMES[cat])}"
                + (f"<br>projected from {esc(vf)}" if vf != "objective" else "") + (f"<br>{esc(r[:160])}" if r else "")
                for n, d, vf, r in zip(sub["number"], sub["duplicate_of"], sub["value_from"], sub["reason"])]
        name = "pruned on cost (projected when stopped)" if cat == "pruned" else OUTCOMES[cat]
        fig.add_scatter(x=sub["number"].tolist(), y=rounded(sub["value"]), mode="markers", name=name, text=text,
                        hovertemplate="%{text}<br>%{y} ¥<extra></extra>",
                        marker=dict(color=COLORS[cat], size=10, symbol=SYMBOLS[cat], line=dict(width=1, color="#333")))
    if hist["best_so_far"].notna().any():
        fig.add_scatter(x=hist["number"].tolist(), y=rounded(hist["best_so_far"]), mode="lines", name="the answer so far (cheapest that reaches the threshold)",
                        line=dict(color="#222", shape="hv"), hoverinfo="skip")
    fig.update_xaxes(dtick=max(1, math.ceil(len(hist) / 20)))  # whole trial numbers only
    return _layout(fig, x="trial", y="projected full-run cost (¥)", height=380)


def importance(values: dict[str, float]) -> go.Figure:
    names = list(values)[::-1]
    fig = go.Figure(go.Bar(x=rounded(values[n] for n in names), y=[esc(n) for n in names], orientation="h", marker_color="#4c78a8",
                           name="how much each knob explains the projected cost"))
    fig = _layout(fig, x="importance (normalised)", y="", height=max(260, 40 * len(names) + 110))
    return fig.update_layout(margin=dict(l=20, r=20, t=80, b=50), yaxis=dict(automargin=True))


@functools.lru_cache(maxsize=4)
def _drill_frame(has_memory: bool, has_nvml: bool) -> tuple[str, dict[tuple[int, int], tuple[str, str]]]:
    """The drill-down layout (JSON) and the axis pair of each cell, built by plotly once per shape."""
    rows = 2 if has_nvml else 1
    titles = ["step time by phase (s)"] + (["allocator peak (GB)"] if has_memory else [])
    titles += ["NVML memory used (GB)", "NVML utilisation (%)", "NVML power (W)"] if has_nvml else []
    specs = [[{"colspan": 2}, None, {}] if has_memory else [{"colspan": 3}, None, None]] + ([[{}, {}, {}]] if has_nvml else [])
    fig = make_subplots(rows=rows, cols=3, specs=specs, subplot_titles=titles, vertical_spacing=0.18, horizontal_spacing=0.07)
    fig.update_layout(template=go.layout.Template(), height=300 * rows, margin=dict(l=50, r=20, t=40, b=40), showlegend=True,
                      plot_bgcolor="#fafafa", font=dict(size=11), legend=dict(orientation="h", y=-0.3 / rows))
    fig.update_xaxes(gridcolor="#e5e5e5")
    fig.update_xaxes(title_text="step", row=1)
    if has_nvml:
        fig.update_xaxes(title_text="seconds since the first sample", row=2)
    fig.update_yaxes(gridcolor="#e5e5e5", rangemode="tozero")
    cells = [(1, 1)] + ([(1, 3)] if has_memory else []) + ([(2, 1), (2, 2), (2, 3)] if has_nvml else [])
    axes = {}
    for r, c in cells:
        sub = fig.get_subplot(r, c)
        axes[(r, c)] = (sub.xaxis.plotly_name.replace("axis", ""), sub.yaxis.plotly_name.replace("axis", ""))
    return json.dumps(fig.to_plotly_json()["layout"]), axes


def drilldown(dd: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """One probe: phase times and allocator peaks per step; NVML memory, utilisation and power per GPU.

    Returns the plotly figure as a plain ``{"data", "layout"}`` dict: validating hundreds of
    traces through graph objects costs a quarter second per probe, and these are only drawn
    when a reader opens the probe.
    """
    has_nvml = not dd["nvml"].empty
    layout, axes = _drill_frame(not dd["memory"].empty, has_nvml)
    traces: list[dict[str, Any]] = []

    def line(cell: tuple[int, int], x: Any, y: Any, name: str, **kw: Any) -> None:
        xa, ya = axes[cell]
        traces.append({"type": "scatter", "mode": "lines", "x": rounded(x), "y": rounded(y), "name": name, "xaxis": xa, "yaxis": ya, **kw})

    t = dd["timing"]
    for col in (c for c in t.columns if c != "step"):  # phases stacked; the whole step as a line over them
        name = col.removeprefix("timing_s/")
        style = ({"line": {"color": "#111", "width": 1.5}} if name == "step"
                 else {"stackgroup": "phases", "line": {"width": 0.5, "color": PHASE_COLORS.get(name)}})
        line((1, 1), t["step"], t[col], name, **style)
    m = dd["memory"]
    for col, color in ((metrics.MAX_ALLOCATED_GB, "#9ecae1"), (metrics.MAX_RESERVED_GB, "#3182bd")):
        if col in m:
            line((1, 3), m["step"], m[col], col.split("_")[2], line={"color": color})
    for i, (gpu, g) in enumerate(dd["nvml"].groupby("gpu") if has_nvml else []):
        for c, metric in enumerate(("mem_used_gb", "util_gpu", "power_w"), start=1):
            if metric in g:
                line((2, c), g["t"], g[metric], f"GPU {esc(gpu)}", legendgroup=f"gpu{gpu}", showlegend=c == 1,
                     line={"color": PALETTE[(i + 5) % len(PALETTE)]})
    return {"data": traces, "layout": json.loads(layout)}
