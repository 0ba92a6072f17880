"""Assemble the report: sections of escaped HTML around the figures, in one self-contained page.

plotly.js is inlined once in the head; the main figures are plotly ``to_html``
fragments; per-probe drill-downs are figure JSON in ``<script type="application/json">``
rendered when their ``<details>`` opens (``#expand-all`` opens every one), so a
report of hundreds of probes opens quickly.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from html import escape
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd
import plotly.offline

from tunekit.report import data, figures, series
from tunekit.report.load import Records

TEMPLATE = Path(__file__).with_name("template.html")
MAX_BARS = 40
"""Configurations in the per-configuration bar charts (cheapest first; the table lists all)."""
MAX_COMM = 8
MAX_HIGHLIGHT = 8
TABLE_COLUMNS = {  # column -> (header, numeric)
    "label": ("probe", False), "trial": ("trial", True), "recipe": ("recipe", False), "status": ("status", False),
    "category": ("verdict", False), "reason": ("reason", False), "reward": ("reward", True),
    "threshold": ("threshold", True), "projected_yuan": ("projected ¥", True),
    "projected_gpu_hours": ("GPU-hours", True), "projected_wall_s": ("projected wall (h)", True),
    "probe_yuan": ("probe ¥", True), "step_s": ("step s", True), "peak_reserved_gb": ("reserved GB", True),
    "nvml_peak_gb": ("NVML GB", True), "tokens_per_s_per_gpu": ("tokens/s/GPU", True),
    "mfu_actor": ("MFU actor", True), "mfu_critic": ("MFU critic", True),
}


def json_script(obj: Any, element_id: str) -> str:
    """JSON inside <script type="application/json">, with ``<``, ``>`` and ``&`` escaped so no text ends the tag."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{escape(element_id)}">{text}</script>'


def fmt(v: Any, spec: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, spec)
    return str(v)


def hours(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min" if m else f"{seconds:.0f} s"


def _figure(fig: Any, name: str) -> str:
    return f'<div class="figure" data-figure="{name}">' + fig.to_html(full_html=False, include_plotlyjs=False,
                                                                      config={"displaylogo": False}) + "</div>"


def _section(sid: str, title: str, body: str, note: str = "") -> str:
    note_html = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{note_html}{body}</section>'


def _warn(text: str) -> str:
    return f'<p class="warn">{text}</p>'


def _alerts(h: dict[str, Any], offpolicy: dict[str, str], missing: int) -> str:
    """Red lines under the headline: the best is off-policy or not feasible here, the search's notes, gaps in the records."""
    best, out = h["best"], []
    if best and best["label"] in offpolicy:
        out.append(f"{escape(best['label'])} is off-policy ({escape(offpolicy[best['label']])}): not a saving until it learns the same.")
    if best and best["category"] != "feasible":  # the search's pick, but these records read differently
        out.append(f"This report reads {escape(best['label'])} as {escape(best['category'])} (reward {fmt(best['reward'], '.3f')}).")
    out += [escape(n) for n in h.get("notes", [])]
    if missing:
        out.append(f'Some records are incomplete: {missing} thing(s) missing, listed under <a href="#missing">What is missing</a>.')
    return "".join(map(_warn, out))


def _kpis(h: dict[str, Any]) -> str:
    best, thr = h["best"], h["threshold"]
    kpis = [("projected cost", f"¥{fmt(best['projected_yuan'])}"), ("GPU-hours", fmt(best["projected_gpu_hours"])),
            ("wall time", hours(best["projected_wall_s"]))]
    if h["saving_yuan"] is not None:
        pct = f" ({h['saving_pct']:.1f}%)" if h["saving_pct"] is not None else ""
        kpis.append(("saving vs baseline", f'<span class="{"good" if h["saving_yuan"] >= 0 else "bad"}">¥{h["saving_yuan"]:.4g}{pct}</span>'))
    else:
        kpis.append(("saving vs baseline (none: see notes)" if h["notes"] else "saving vs baseline", "–"))
    if best["reward"] is not None:
        ok = thr is None or best["reward"] >= thr
        vs = f" vs threshold {thr:g}" if thr is not None else " (no threshold)"
        kpis.append(("reward" + vs, f'<span class="{"good" if ok else "bad"}">{best["reward"]:.3f}</span>'))
    return "".join(f'<div class="kpi"><div class="v">{v}</div><div class="k">{escape(k)}</div></div>' for k, v in kpis)


def headline(h: dict[str, Any], offpolicy: dict[str, str], missing: int) -> str:
    best, base, thr = h["best"], h["baseline"], h["threshold"]
    counts = ", ".join(f"{n} {escape(str(s))}" for s, n in sorted(h["counts"].items()))
    stop = f' The search stopped: {escape(str(h["stop_reason"]))}.' if h.get("stop_reason") else ""
    meta = f'<p class="note">{h["probes"]} probes ({counts}); probe spend ¥{h["spend_yuan"]:.4g}; best from {escape(h["source"])}.{stop}</p>'
    alerts = _alerts(h, offpolicy, missing)
    if best is None:
        top = h.get("top_reward")
        why = f"; the highest reward was {top['reward']:.3f} ({escape(top['label'])})" if top else ""
        goal = f" the threshold {thr:g}" if thr is not None else " a reward threshold (none recorded)"
        return _section("headline", "Headline", f'<h2 class="bad">No probe reached{goal}{why}.</h2>{alerts}{meta}')
    base_txt = (f"baseline {escape(base['label'])} ({escape(base['recipe'])}), projected ¥{fmt(base['projected_yuan'])}"
                if base else "no baseline recorded")
    changes = "".join(f"<li><code>{escape(k)}</code>: {escape(fmt(a))} → <b>{escape(fmt(b))}</b></li>" for k, a, b in h["changes"])
    title = f"Cheapest configuration that reaches the threshold: {best['label']} ({best['recipe']})"
    body = (f'<h2>{escape(title)}</h2><div class="kpis">{_kpis(h)}</div><p>Compared with the {base_txt}.</p>'
            + (f"<p>Changes vs the baseline:</p><ul>{changes}</ul>" if changes else "")
            + f'<p>Command:</p><pre class="cmd">{escape(str(h["command"] or ""))}</pre>{alerts}{meta}')
    return _section("headline", "Headline", body)


def _cell(col: str, v: Any, numeric: bool, extra: str = "") -> str:
    if col == "projected_wall_s" and data.number(v) is not None:
        v = v / 3600
    sort = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    text = escape(fmt(v))
    cls = " ".join(filter(None, ["num" if numeric else "", extra]))
    title = f' title="{escape(str(v))}"' if col == "reason" and v else ""
    if col == "label":
        text = f'<a href="#drill-{escape(str(v))}">{text}</a>'
    return f'<td class="{cls}" data-v="{escape(sort)}"{title}>{text}</td>'


def probe_table(df: pd.DataFrame, knobs: list[str], offpolicy: dict[str, str]) -> str:
    if df.empty:
        return _section("probes", "All probes", '<p class="empty">No probes.</p>')
    varying = set(data.varying_knobs(df, knobs))
    head = "".join(f"<th>{escape(h)}</th>" for h, _ in TABLE_COLUMNS.values())
    head += "".join(f'<th class="knob {"diff" if k in varying else "same"}">{escape(k.removeprefix("knob:"))}</th>' for k in knobs)
    rows = []
    for _, r in df.iterrows():
        cells = [_cell(c, r[c], num, f"cat-{r['category']}" if c == "category" else "reason" if c == "reason" else "")
                 for c, (_, num) in TABLE_COLUMNS.items()]
        cells += [_cell(k, r[k], isinstance(r[k], (int, float)) and not isinstance(r[k], bool), "knob diff" if k in varying else "knob same")
                  for k in knobs]
        cls = ' class="offpolicy"' if r["label"] in offpolicy else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    toggle = (f'<label><input type="checkbox" id="diff-only" checked> differences only '
              f"({len(varying)} of {len(knobs)} knobs differ between probes)</label>")
    body = (f'<p>{toggle} · click a header to sort · off-policy rows in red · the probe links open its drill-down</p>'
            f'<div class="tablewrap"><table id="probe-table" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')
    return _section("probes", "All probes", body)


def _figure_or(sid: str, title: str, make: Any, empty: str, note: str = "") -> str:
    fig = make()
    body = _figure(fig, sid) if fig is not None else f'<p class="empty">{empty}</p>'
    return _section(sid, title, body, note)


def policy(v: dict[str, Any]) -> str:
    warn = "".join(f"<li>{escape(w)}</li>" for w in v["warnings"])
    checks = "".join(f'<p class="note">{escape(c)}</p>' for c in v.get("checks", []))
    parts = [checks + (f'<ul class="warnings">{warn}</ul>' if warn else '<p class="note">No equivalence warnings recorded by a search.</p>')]
    df = v["probes"]
    if len(df):
        rows = "".join(
            f'<tr class="{"offpolicy" if r.verdict == "off-policy" else ""}"><td>{escape(str(r.label))}</td><td>{escape(fmt(r.backend))}</td>'
            f'<td class="num">{fmt(r.staleness_steps)}</td><td class="num">{fmt(r.logprob_abs_diff, ".3g")}</td>'
            f'<td class="{"bad" if r.verdict == "off-policy" else ""}">{escape(r.verdict)}</td><td>{escape(r.why)}</td></tr>'
            for r in df.itertuples())
        parts.append(f'<div class="tablewrap"><table class="sortable"><thead><tr><th>probe</th><th>backend</th><th>staleness steps</th>'
                     f'<th>|Δ logprob| median</th><th>verdict</th><th>why</th></tr></thead><tbody>{rows}</tbody></table></div>')
    note = (f"Off-policy: rollout weights stale (<code>rollout/staleness_steps</code> &gt; 0) or rollout vs actor "
            f"token logprobs differ by more than {data.LOGPROB_DIFF_WARN} on average. Such a probe is not a saving.")
    return _section("policy", "On-policy and equivalence verdicts", "".join(parts), note)


def drill(records: Records, df: pd.DataFrame) -> str:
    by_dir = {r.run_dir: r for r in df.itertuples()}
    items = []
    for p in records.probes:
        r = by_dir[str(p.run_dir)]
        dd = series.drilldown(p)
        has_plot = not (dd["timing"].empty and dd["memory"].empty and dd["nvml"].empty)
        kv = {k: v for k, v in p.summary.items() if k not in ("steady", "reason", "equivalence") and not isinstance(v, (dict, list))}
        kv |= {f"steady {k}": v for k, v in series.steady(p).items()}
        kv_html = "".join(f"<div><b>{escape(str(k))}</b>: {escape(fmt(v))}</div>" for k, v in kv.items())
        reason = f'<p class="bad">{escape(r.reason)}</p>' if r.reason else ""
        missing = f'<p class="note">missing: {escape("; ".join(p.missing))}</p>' if p.missing else ""
        why_not = str(p.summary.get("nvml/reason") or "no nvml.parquet")
        nvml = "" if not dd["nvml"].empty else f'<p class="note">No NVML timeline: {escape(why_not)}.</p>'
        plot = ""
        if has_plot:
            spec = json.dumps(figures.drilldown(dd), separators=(",", ":"))
            height = 600 if not dd["nvml"].empty else 300
            plot = f'<div class="plotly-graph-div" style="height:{height}px"></div>' + json_script(spec, f"spec-{r.label}")
        items.append(f'<details class="drill" id="drill-{escape(r.label)}" data-spec="spec-{escape(r.label)}"><summary><b>{escape(r.label)}</b> '
                     f'{escape(r.recipe)} · <span class="cat-{r.category}">{escape(r.status)}</span> · run <code>{escape(p.id)}</code></summary>'
                     f'{reason}{missing}<div class="kv">{kv_html}</div>{nvml}{plot}</details>')
    note = 'Open a probe to draw its timelines (<a href="#expand-all">open all</a>). Series longer than ' \
           f"{series.MAX_POINTS} points are bucket-averaged (memory keeps bucket peaks)."
    return _section("drill", "Per-probe drill-down", "".join(items), note)


def render(records: Records, *, sources: list[str]) -> str:
    df, knobs = data.probe_table(records)
    head = data.headline(records, df, knobs)
    best = head["best"]["label"] if head["best"] else None
    base = head["baseline"]["label"] if head["baseline"] else None
    by_label = dict(zip(data.labels(records.probes), records.probes))
    bars = {lbl: by_label[lbl] for lbl in data.select_labels(df, MAX_BARS, (best, base))}
    capped = f"Showing the {len(bars)} cheapest of {len(df)} probes; the table has all." if len(df) > len(bars) else ""
    cr = data.cost_reward(df)
    varying = data.varying_knobs(df, knobs)
    verdicts = data.policy_verdicts(records, df)
    off = verdicts["probes"][verdicts["probes"]["verdict"] == "off-policy"] if len(verdicts["probes"]) else pd.DataFrame(columns=["label", "why"])
    offpolicy = dict(zip(off["label"], off["why"]))
    phases, comm, mem = series.phase_times(bars), series.comm_phases(bars), series.memory(bars)
    comm_labels = data.select_labels(df[df["label"].isin(set(comm["label"]))], MAX_COMM, ())
    comm = comm[comm["label"].isin(comm_labels)]
    curves = {lbl: c for lbl, p in by_label.items() if len(c := series.reward_curve(p))}
    highlight = [x for x in dict.fromkeys([best, base, *data.select_labels(df, len(df), ())]) if x in curves][:MAX_HIGHLIGHT]
    hist, imp = data.search_history(records, df), data.importance(records)
    missing = data.missing_notes(records, df)
    unplotted = f"Not plotted (no cost or reward): {escape(data.few(cr['unplotted']))}." if cr["unplotted"] else ""
    sections = [
        headline(head, offpolicy, len(missing)),
        _figure_or("cost", "Cost vs reward", lambda: figures.cost_reward(cr, varying, best, offpolicy) if len(cr["points"]) else None,
                   "No probe has both a projected cost and a reward.", unplotted),
        probe_table(df, knobs, offpolicy),
        _figure_or("phases", "Step time by phase", lambda: figures.phase_bars(phases) if len(phases) else None,
                   "No step timings recorded.", f"Median over steady (post-warm-up) steps. {capped}"),
        _figure_or("comm", "Communication: exposed vs total per phase", lambda: figures.comm_bars(comm) if len(comm) else None,
                   "No communication measured (single-process probes, or comm profiling off).",
                   f"Light bar: all communication kernel time; dark: the part not overlapped by compute. Up to {MAX_COMM} cheapest probes. "
                   "On CPU (gloo) only the wait (exposed) time is measured."),
        _figure_or("memory", "Peak memory per GPU: allocator vs NVML", lambda: figures.memory_bars(mem) if len(mem) else None,
                   "No memory peaks recorded (CPU probes have no allocator or NVML figures).",
                   f"Allocator peaks are rank 0's PyTorch caching allocator; NVML is what the GPU reports in use (the gap: vLLM, NCCL, "
                   f"fragmentation, other processes). Hover shows the roles on each GPU. {capped}"),
        _figure_or("rewards", "Reward curves", lambda: figures.reward_curves(curves, highlight, cr["threshold"]) if curves else None,
                   "No reward was logged.", "Best, baseline and the next cheapest probes in colour; the rest grey."),
        _section("search", "Search history and which knobs mattered", _search_body(hist, imp)),
        policy(verdicts),
        drill(records, df),
        _section("missing", "What is missing", _missing_body(missing)),
    ]
    meta = f"generated {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} from {escape(', '.join(sources))}"
    if records.study is not None:
        meta += f" · study {escape(records.study.name)} in {escape(records.study.storage)}"
    return Template(TEMPLATE.read_text()).substitute(
        title="tunekit report", meta=meta, plotlyjs=plotly.offline.get_plotlyjs(), body="\n".join(sections))


def _search_body(hist: dict[str, Any], imp: dict[str, Any]) -> str:
    trials = hist["trials"]
    left = (_figure(figures.history(trials), "history") if trials["value"].notna().any()
            else '<p class="empty">No trial has a value yet.</p>')
    left = f'<p class="note">From {escape(hist["source"])}; {len(trials)} trials.</p>{left}'
    right = (_figure(figures.importance(imp["values"]), "importance") + f'<p class="note">{escape(imp["note"])}</p>' if imp["values"]
             else f'<p class="empty">No parameter importance: {escape(imp["note"])}</p>')
    return f'<div class="grid2"><div>{left}</div><div><p class="note">Optuna parameter importance (objective: projected ¥).</p>{right}</div></div>'


def _missing_body(notes: list[str]) -> str:
    if not notes:
        return '<p class="note">Nothing: every record has the files and columns this report reads.</p>'
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return ('<p class="note">Records from an older tunekit or a probe that died early; the figures show what is there.</p>'
            f'<ul class="missing">{items}</ul>')
