"""The report's lower sections as HTML: confirmation round, search history, on-policy verdicts, drill-down, gaps."""

from __future__ import annotations

import json
from collections.abc import Callable
from html import escape
from typing import Any

import pandas as pd

from tunekit import metrics
from tunekit.report import data, figures, series
from tunekit.report.html import fmt, json_script, section
from tunekit.report.load import Records

def policy(v: dict[str, Any]) -> str:
    warn = "".join(f"<li>{escape(w)}</li>" for w in v["warnings"])
    checks = "".join(f'<p class="note">{escape(c)}</p>' for c in v.get("checks", []))
    parts = [checks + (f'<ul class="warnings">{warn}</ul>' if warn else '<p class="note">No equivalence warnings recorded by a search.</p>')]
    df = v["probes"]
    if len(df):
        rows = "".join(
            f'<tr class="{"offpolicy" if r.verdict == "off-policy" else ""}"><td>{escape(r.probes)}</td><td>{escape(fmt(r.backend))}</td>'
            f'<td class="num">{fmt(r.staleness_steps)}</td><td class="num">{escape(r.diff)}</td>'
            f'<td class="{"bad" if r.verdict == "off-policy" else ""}">{escape(r.verdict)}</td><td>{escape(r.why)}</td></tr>'
            for r in _same_verdicts(df).itertuples())
        parts.append(f'<div class="tablewrap"><table class="sortable"><thead><tr><th>probes</th><th>backend</th><th>staleness steps</th>'
                     f'<th>|Δ logprob| median</th><th>verdict</th><th>why</th></tr></thead><tbody>{rows}</tbody></table></div>')
    note = (f"Off-policy: rollout weights stale (<code>rollout/staleness_steps</code> &gt; 0) or rollout vs actor "
            f"token logprobs differ by more than {data.LOGPROB_DIFF_WARN} on average. Such a probe is not a saving.")
    return section("policy", "On-policy and equivalence verdicts", "".join(parts), note)


def _same_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """Probes with the same backend, staleness, verdict and reason as one row: how many, which, and the range of their
    logprob differences."""
    keys = ["backend", "staleness_steps", "verdict", "why"]
    rows = []
    same = [repr(tuple(r)) for r in df[keys].itertuples(index=False)]
    for _, g in df.groupby(pd.Series(same, index=df.index), sort=False):
        diffs = g["logprob_abs_diff"].dropna()
        diff = "–" if diffs.empty else (f"{diffs.min():.3g}" if len(diffs) == 1 or diffs.min() == diffs.max()
                                        else f"{diffs.min():.3g} to {diffs.max():.3g}")
        names = g["label"].astype(str).tolist()
        rows.append({"probes": names[0] if len(names) == 1 else f"{len(names)} probes: {data.few(names, 6)}",
                     "backend": g["backend"].iloc[0], "staleness_steps": g["staleness_steps"].iloc[0], "diff": diff,
                     "verdict": g["verdict"].iloc[0], "why": g["why"].iloc[0]})
    return pd.DataFrame(rows)


def _groups_html(groups: dict[str, list[tuple[str, Any, str]]]) -> str:
    blocks = []
    for group, rows in groups.items():
        body = "".join(f'<tr><td>{escape(k)}</td><td class="num">{escape(fmt(v))}</td><td class="unit">{escape(u)}</td></tr>'
                       for k, v, u in rows)
        blocks.append(f'<div class="group"><h4>{escape(group)}</h4><table>{body}</table></div>')
    return f'<div class="groups">{"".join(blocks)}</div>'


EVAL_ROWS = 4
"""Held-out answers shown of each of a probe's first and last evaluation."""


def samples_html(samples: pd.DataFrame, eval_samples: pd.DataFrame | None = None) -> str:
    """The first and last step's samples of a probe and, with ``eval_samples``, the first :data:`EVAL_ROWS` answers
    of its first and last evaluation, each evaluation with its mean over all its answers, as small tables (the
    model's words, escaped)."""
    def table(title: str, key: str, edges) -> str:
        rows = "".join(f'<tr><td class="num">{step}</td><td><code>{escape(str(s.prompt))}</code></td>'
                       f'<td><code>{escape(str(s.response))}</code></td><td><code>{escape(fmt(s.answer))}</code></td>'
                       f'<td class="num">{escape(fmt(data.number(s.reward), ".3g"))}</td></tr>'
                       for step, rows_ in edges for s in rows_.itertuples())
        return (f'<h4>{title}</h4><div class="tablewrap"><table class="samples"><thead><tr>'
                f'<th>{key}</th><th>prompt</th><th>response</th><th>answer</th><th>reward</th></tr></thead><tbody>{rows}'
                '</tbody></table></div>') if rows else ""

    out = table("What the model said (first and last step)", "step", data.edge_samples(samples))
    evaluations = data.edge_samples(eval_samples, "trained_steps") if eval_samples is not None else []
    if evaluations:
        means = "; ".join(f"after {t} steps {rows['reward'].mean():.3g} over {len(rows)}" for t, rows in evaluations)
        out += table(f"What it answered the held-out prompts (first and last evaluation; mean reward {escape(means)})",
                     "steps trained", [(t, rows.head(EVAL_ROWS)) for t, rows in evaluations])
    return out


def drill(records: Records, df: pd.DataFrame) -> str:
    by_dir = {r.run_dir: r for r in df.itertuples()}
    items = []
    for p in records.probes:
        r = by_dir[str(p.run_dir)]
        dd = series.drilldown(p)
        has_plot = not (dd["timing"].empty and dd["memory"].empty and dd["nvml"].empty)
        reason = f'<p class="bad">{escape(r.reason)}</p>' if r.reason else ""
        own_steps = data.number(p.summary.get("cost/target_steps"))
        if data.number(r.projected_steps) is not None and own_steps is not None and r.projected_steps != own_steps:
            reason += (f'<p class="note">The search priced this run over {r.projected_steps:.0f} steps ('
                       f'{escape(r.run_rule or "its rule")}); the probe\'s own records below project {own_steps:.0f}.</p>')
        missing = f'<p class="note">missing: {escape("; ".join(p.missing))}</p>' if p.missing else ""
        why_not = p.summary.get("nvml/reason") or ("no nvml.parquet" if p.summary.get(metrics.NVML_AVAILABLE) else "")
        nvml = f'<p class="note">No NVML timeline: {escape(str(why_not))}.</p>' if dd["nvml"].empty and why_not else ""
        aid = data.anchor(r.label)
        plot = ""
        if has_plot:
            spec = json.dumps(figures.drilldown(dd), separators=(",", ":"))
            height = 600 if not dd["nvml"].empty else 300
            plot = f'<div class="plotly-graph-div" style="height:{height}px"></div>' + json_script(spec, f"spec-{aid}")
        cat = r.category.replace(" ", "-")
        items.append(f'<details class="drill" id="drill-{escape(aid)}" data-spec="spec-{escape(aid)}"><summary><b>{escape(r.label)}</b> '
                     f'{escape(r.recipe)} · <span class="cat-{cat}">{escape(r.outcome)}</span> · run <code>{escape(p.id)}</code></summary>'
                     f'{reason}{missing}{_groups_html(series.drill_groups(p, r.outcome))}{samples_html(p.samples, p.eval_samples)}{nvml}{plot}'
                     '</details>')
    if not items:
        return ""
    note = ('Open a probe for its records grouped with units, what the model said at its first and last step, and '
            'its timelines (<a href="#expand-all">open all</a>). '
            f"Series longer than {series.MAX_POINTS} points are bucket-averaged (memory keeps bucket peaks).")
    return section("drill", "Per-probe drill-down", "".join(items), note)


def search_body(hist: dict[str, Any], imp: dict[str, Any], kind: dict[str, Any], figure: Callable[[Any, str], str]) -> str:
    """Trial history and parameter importance; for a comparison of runs, one line saying there is none."""
    trials = hist["trials"]
    if not len(trials):
        why = ("No search history: these runs were not sampled by <code>tunekit search</code>." if not kind["search"]
               else "No search history: search.json lists no trials and no study was found.")
        return section("search", "Search history and which knobs mattered", f'<p class="empty">{why}</p>', empty=True)
    lost = trials[trials["value"].isna()]
    lost_note = ("Not drawn (no projected cost at all): " + escape(data.few(
        [f"trial {n} ({s if c == 'incomplete' else data.outcome(c, s) if c in data.OUTCOMES else s})"
         for n, c, s in zip(lost["number"], lost["category"], lost["state"])])) + "." if len(lost) else "")
    left = (figure(figures.history(trials), "history") if trials["value"].notna().any()
            else '<p class="empty">No trial has a projected cost yet.</p>')
    dups = trials[trials["duplicate_of"].notna()]
    dup_note = (" " + escape(data.few([f"trial {n} = trial {d:.0f}" for n, d in zip(dups["number"], dups["duplicate_of"])]))
                + " (same configuration, reused without a probe)." if len(dups) else "")
    left = f'<p class="note">From {escape(hist["source"])}; {len(trials)} trials.{dup_note} {lost_note}</p>{left}'
    right = (figure(figures.importance(imp["values"]), "importance") + f'<p class="note">{escape(imp["note"])}</p>' if imp["values"]
             else f'<p class="empty">No parameter importance: {escape(imp["note"])}</p>')
    body = f'<div class="grid2"><div>{left}</div><div><p class="note">Which knobs mattered: how much of the projected cost&#x27;s spread each knob explains (Optuna&#x27;s importance, over the trials that ran to their end).</p>{right}</div></div>'
    return section("search", "Search history and which knobs mattered", body)


def confirmation(conf: dict[str, Any] | None) -> str:
    """The search's confirmation round as recorded: its answer, then one row per configuration; nothing without one."""
    if conf is None:
        return ""
    if conf["running"]:
        answer = f'<p class="warn">The confirmation round had not finished: {conf["probes"]} probe(s) so far, no answer yet.</p>'
    else:
        sentence = str(conf.get("sentence") or "")
        verdict = f'<b>{escape(str(conf["verdict"]))}</b>: ' if conf.get("verdict") and not sentence.startswith(str(conf["verdict"])) else ""
        answer = f'<p class="answer why">{verdict}{escape(str(conf.get("sentence") or "no answer recorded"))}</p>'
    facts = "".join(f"<li>{escape(str(v))}</li>" for v in conf["facts"].values() if v not in (None, ""))
    rows, table = conf["rows"], ""
    if len(rows):
        head = "".join(f"<th>{escape(str(c))}</th>" for c in rows.columns)
        body = "".join("<tr>" + "".join(f"<td>{escape(fmt(v))}</td>" for v in r) + "</tr>" for r in rows.itertuples(index=False))
        table = f'<div class="tablewrap"><table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    note = ("Before it answers, the search probes its top candidates and the baseline again with fresh seeds, alternating them "
            "in one run; the answer rests on paired cost ratios (below 1: cheaper than the baseline), so a noisy machine "
            "does not change it. Each configuration's reward here is over all its seeds, as in the table above; each seed's "
            "probe has its own drill-down, <i>trial N (seed S)</i>.")
    return section("confirm", "Confirmation round", f"{answer}{table}" + (f'<ul class="facts">{facts}</ul>' if facts else ""), note)


def missing_body(notes: list[str]) -> str:
    if not notes:
        return '<p class="empty">Nothing: every record has the files and columns this report reads.</p>'
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return ('<p class="note">Records from an older tunekit or a probe that died early; the figures show what is there.</p>'
            f'<ul class="missing">{items}</ul>')
