"""Assemble the report: sections of escaped HTML around the figures, in one self-contained page.

plotly.js is inlined once in the head (:mod:`tunekit.report.plotlyjs`); the main figures
are plotly ``to_html`` fragments; per-probe drill-downs are figure JSON in
``<script type="application/json">`` rendered when their ``<details>`` opens
(``#expand-all`` opens every one), so a report of hundreds of probes opens quickly.
"""

from __future__ import annotations

import datetime as dt
import math
from html import escape
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from tunekit import metrics as schema
from tunekit.estimate import memory
from tunekit.report import checks, data, figures, series
from tunekit.report import headline as story
from tunekit.report.html import fmt, hours, section, warn
from tunekit.report.load import Records
from tunekit.report.loadtest import loadtest_section
from tunekit.report.plotlyjs import plotly_js
from tunekit.report.sections import confirmation, drill, missing_body, policy, search_body

TEMPLATE = Path(__file__).with_name("template.html")
MAX_BARS = 40
"""Configurations in the per-configuration bar charts (cheapest first; the table lists all)."""
MAX_COMM = 8
MAX_HIGHLIGHT = 8
TABLE_COLUMNS = {  # column -> header
    "reward": "reward", "reward_ci": "reward interval", "threshold": "threshold", "projected_yuan": "projected ¥",
    "projected_steps": "projected steps", "projected_gpu_hours": "projected GPU-hours", "projected_wall_s": "projected wall (h)",
    "seeds": "seeds",
    "probe_yuan": "probe ¥", "steps": "probe steps", "step_s": "step s", "peak_reserved_gb": "reserved GB",
    "nvml_peak_gb": "NVML GB", "tokens_per_s_per_gpu": "tokens/s/GPU", "mfu_actor": "MFU actor %", "mfu_critic": "MFU critic %",
    "reason": "reason",
}
PERCENT = ("mfu_actor", "mfu_critic")


def _figure(fig: Any, name: str) -> str:
    return f'<div class="figure" data-figure="{name}">' + fig.to_html(full_html=False, include_plotlyjs=False,
                                                                      config={"displaylogo": False}) + "</div>"


def _alerts(h: dict[str, Any], offpolicy: dict[str, str], missing: int) -> str:
    """Red lines under the headline: the best is off-policy or not feasible here, the search's notes, gaps in the records."""
    best, out = h["best"], []
    if best and best["label"] in offpolicy:
        out.append(f"{escape(best['label'])} is off-policy ({escape(offpolicy[best['label']])}): not a saving until it learns the same.")
    if best and best["category"] != "feasible" and not h.get("reaches"):  # the search's pick, but these records read differently
        out.append(f"This report reads {escape(best['label'])} as {escape(best['outcome'])} (reward {fmt(best['reward'], '.3f')}).")
    out += [escape(n) for n in h.get("notes", [])]
    if missing:
        out.append(f'Some records are incomplete: {missing} thing(s) missing, listed under <a href="#missing">What is missing</a>.')
    return "".join(map(warn, out))


def _reward_text(b: dict[str, Any]) -> str:
    ci = f" [{b['reward_low']:.3f}, {b['reward_high']:.3f}]" if b.get("reward_low") is not None and b.get("reward_high") is not None else ""
    return f"{b['reward']:.3f}{ci}"


def _kpis(h: dict[str, Any]) -> str:
    best, thr, search = h["best"], h["best"]["threshold"], h["kind"]["search"]
    kpis = [("projected full-run cost", f"¥{fmt(best['projected_yuan'])}"),
            (f"projected {h.get('hours', 'GPU-hours')}", fmt(best["projected_gpu_hours"])),
            ("projected wall time", hours(best["projected_wall_s"]))]
    if best.get("projected_steps") is not None:
        kpis.append(("steps the run needs", fmt(best["projected_steps"], ".0f")))
    same = h["baseline"] is not None and h["baseline"]["label"] == best["label"]
    if h["saving_yuan"] is not None and not same:
        pct = f" ({h['saving_pct']:.1f}%)" if h["saving_pct"] is not None else ""
        kpis.append(("saving vs baseline" if search else "saving vs the first run",
                     f'<span class="{"good" if h["saving_yuan"] >= 0 else "bad"}">¥{h["saving_yuan"]:.4g}{pct}</span>'))
    elif h["baseline"] is not None and not same:
        kpis.append(("saving vs baseline (none: see below)" if h["notes"] else "saving vs baseline", "–"))
    reaches = h.get("reaches") or {}
    if reaches.get("reward"):  # the search's answer: the confirmation round's reward when it ran, else the probe's
        r = reaches["reward"]
        cls = "good" if reaches.get("verdict") == "feasible" else "noisy"
        kpis.append((f"reward vs threshold {reaches['threshold']:g} ({reaches.get('wording', '')})",
                     f'<span class="{cls}">{escape(r["text"])}</span>'))
    elif best["reward"] is not None:
        ok = thr is None or best["reward"] >= thr
        vs = f" (mean of last {best['window']} steps) vs threshold {thr:g}" if thr is not None else " (no threshold)"
        kpis.append(("reward" + vs, f'<span class="{"good" if ok else "bad"}">{_reward_text(best)}</span>'))
    return "".join(f'<div class="kpi"><div class="v">{v}</div><div class="k">{escape(k)}</div></div>' for k, v in kpis)


def _what(h: dict[str, Any]) -> str:
    """One line: a search of N trials, or a comparison of runs (which is not a search)."""
    kind, counts = h["kind"], ", ".join(f"{n} {escape(str(s))}" for s, n in sorted(h["counts"].items()))
    spend = f"probe spend ¥{h['spend_yuan']:.4g}"
    if kind["search"]:
        if h.get("search_spent_yuan") is not None:  # the search's own count: probes stopped part-way included
            spend = f"probe spend ¥{h['search_spent_yuan']:.4g} (the search's own count, its stopped probes included)"
        extra = h.get("all_probes", h["probes"]) - h["probes"]
        probes = f"{h['probes']} probes ({counts})" + (
            f"; {h['probes'] + extra} probes in all, {extra} of them the confirmation round's" if extra else "")
        return f'<p class="note">One search: {probes}; {spend}. {escape(h["stop"] or "")}</p>'
    recipes = ", ".join(escape(r) for r in kind["recipes"])
    if h["probes"] == 1:
        return f'<p class="compare">One run of the recipe {recipes}, not a search.</p><p class="note">{counts}; {spend}.</p>'
    what = f"runs of {len(kind['recipes'])} recipes ({recipes})" if len(kind["recipes"]) > 1 else f"runs of the recipe {recipes}"
    return (f'<p class="compare">A comparison of {h["probes"]} {what}, not a search: the runs were not sampled from one '
            "search space" + (", so there is no baseline and no saving" if len(kind["recipes"]) > 1 else "")
            + f'.</p><p class="note">{counts}; {spend}.</p>')


def command_html(command: str) -> str:
    """The command with each space-separated word in an unbreakable box: lines wrap at spaces only, never at the
    hyphen of ``--set``; a word longer than the line still wraps inside its box. Copies as the same text."""
    return " ".join(f'<span class="w">{escape(w)}</span>' for w in command.split(" "))


def headline(h: dict[str, Any], offpolicy: dict[str, str], missing: int) -> str:
    best, base, thr = h["best"], h["baseline"], h["threshold"]
    alerts, what = _alerts(h, offpolicy, missing), _what(h)
    reaches = h.get("reaches") or {}
    lines = [str(x) for x in reaches.get("lines") or []]
    if lines and reaches.get("trial") is not None and reaches.get("cost"):  # whose price, and how sure: as the CLI says
        lines.insert(1, f"full run: trial {reaches['trial']}, projected {reaches['cost']['text']}")
    answer = "".join(f'<p class="answer{" more" if i else ""}">{escape(x)}</p>' for i, x in enumerate(lines))
    if h.get("answer"):
        said = h.get("verdict") and not h["answer"].startswith(h["verdict"])  # a round's sentence opens with it
        answer += (f'<p class="answer why"><b>{escape(h["verdict"])}</b>: {escape(h["answer"])}</p>' if said
                   else f'<p class="answer why">{escape(h["answer"])}</p>')
    if not h["probes"]:
        return section("headline", "Headline", '<p class="empty">No probe records found (their run directories are gone): '
                       "the search history below comes from the study alone.</p>")
    if best is None and reaches:
        return section("headline", "Headline", f'{what}<h2 class="bad">{escape(reaches["title"])}.</h2>{answer}{alerts}')
    if best is None:
        top = h.get("top_reward")
        why = f"; the highest reward was {top['reward']:.3f} ({escape(top['label'])})" if top else ""
        several = len(h["kind"]["recipes"]) > 1 and h.get("thresholds", 1) > 1
        goal = (" its recipe's threshold" if several else f" the threshold {thr:g}" if thr is not None
                else " a reward threshold (none recorded)")
        return section("headline", "Headline", f'{what}<h2 class="bad">No probe reached{goal}{why}.</h2>{answer}{alerts}')
    changes = "".join(f"<li><code>{escape(k)}</code>: {escape(fmt(a))} → <b>{escape(fmt(b))}</b></li>" for k, a, b in h["changes"])
    base_txt = ""
    if base is not None and base["label"] == best["label"]:
        word = "the baseline, the configuration the search started from" if h["kind"]["search"] else "the first run"
        refs = [a for a in reaches.get("against") or [] if a.get("reference")]
        against = " (its cost against the references is in the answer above)" if h["kind"]["search"] and refs else ""
        base_txt = f"<p>{escape(best['label'])} is {word}: there is no saving against it to report{against}.</p>"
    elif base is not None:
        word = "the baseline" if h["kind"]["search"] else "the first run"
        base_txt = (f"<p>Compared with {word}, {escape(base['label'])} ({escape(base['outcome'])}, projected "
                    f"¥{fmt(base['projected_yuan'])})" + (": changes</p><ul>" + changes + "</ul>" if changes else ".</p>"))
    noun = "configuration" if h["kind"]["search"] else "run"
    goal = "the threshold" if h["kind"]["search"] or len(h["kind"]["recipes"]) <= 1 else "its recipe's threshold"
    title = f"Cheapest {noun} that reaches {goal}: {best['label']}" + (f" ({best['recipe']})" if len(h["kind"]["recipes"]) > 1 else "")
    if reaches.get("title"):
        title = reaches["title"]
    elif h.get("named"):  # two configurations the confirmation round could not tell apart: both, never one of them
        title = h["named"]["final_verdict"][:1].upper() + h["named"]["final_verdict"][1:] + f" (the command runs {best['label']})"
    body = (f'{what}<h2>{escape(title)}</h2>{answer}<div class="kpis">{_kpis(h)}</div>{base_txt}'
            f'<p>Command:</p><pre class="cmd">{command_html(str(h["command"] or ""))}</pre>{alerts}')
    return section("headline", "Headline", body)


def _cell(col: str, v: Any, numeric: bool, extra: str = "", prefix: str = "") -> str:
    if col == "projected_wall_s" and data.number(v) is not None:
        v = v / 3600
    if col in PERCENT and data.number(v) is not None:
        v = 100 * v
    sort = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    text = escape(prefix + fmt(v) if sort else fmt(v))
    cls = " ".join(filter(None, ["num" if numeric else "", extra]))
    title = f' title="{escape(str(v))}"' if col == "reason" and v else ""
    if col == "label":
        text = f'<a href="#drill-{escape(data.anchor(v))}">{text}</a>'
    return f'<td class="{cls}" data-v="{escape(sort)}"{title}>{text}</td>'


def _ci(r: pd.Series) -> str:
    lo, hi = data.number(r.get("reward_low")), data.number(r.get("reward_high"))
    text = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "–"
    return f'<td class="num" data-v="{lo if lo is not None else ""}">{text}</td>'


def probe_table(df: pd.DataFrame, knobs: list[str], offpolicy: dict[str, str]) -> str:
    """Name and outcome, then the knobs (those that differ first and shown by default), then the non-empty metrics."""
    if df.empty:
        return ""
    varying = data.varying_knobs(df, knobs)
    ordered = varying + [k for k in knobs if k not in varying]
    metrics = data.table_columns(df)
    recipe = df["recipe"].nunique() > 1
    head = "<th>probe</th><th>outcome</th>" + ("<th>recipe</th>" if recipe else "")
    hours = data.device_hours(df)
    head += "".join(f"<th>{escape(TABLE_COLUMNS[c].replace('GPU-hours', hours))}</th>" for c in metrics)  # what it came to, then its knobs
    head += "".join(f'<th class="knob {"diff" if k in varying else "same"}" title="{escape(k.removeprefix("knob:"))}">'
                    f'{escape(k.removeprefix("knob:").removeprefix("system."))}</th>' for k in ordered)
    rows = []
    for _, r in df.iterrows():
        cells = [_cell("label", r["label"], False), _cell("outcome", r["outcome"], False, f"cat-{r['category'].replace(' ', '-')}")]
        cells += [_cell("recipe", r["recipe"], False)] if recipe else []
        pruned = r["category"] == "pruned"  # stopped before its reward window: its cost is the bound it was pruned at
        cells += [_ci(r) if c == "reward_ci" else
                  _cell(c, None if pruned and c == "reward" else r[c], c not in ("reason", "seeds"),
                        "reason" if c == "reason" else "", "≥ " if pruned and c == "projected_yuan" else "")
                  for c in metrics]
        cells += [_cell(k, r[k], isinstance(r[k], (int, float)) and not isinstance(r[k], bool), "knob diff" if k in varying else "knob same")
                  for k in ordered]
        cls = ' class="offpolicy"' if r["label"] in offpolicy else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    thresholds = df["threshold"].dropna().unique()
    one = len(thresholds) == 1 and df["window"].nunique() == 1 and df["metric"].nunique() == 1
    thr = (f" · reward = {schema.reading_words(df['metric'].iloc[0], int(df['window'].iloc[0]))}, threshold "
           f"{thresholds[0]:g}" if one else "")
    if "seeds" in df and (df["seeds"] != "").any():
        thr += " · a row with seeds: its reward is over them, its projected figures over the confirmation round's probes"
    toggle = (f'<label><input type="checkbox" id="diff-only" checked> only the knobs that differ '
              f"({len(varying)} of {len(knobs)})</label>")
    body = (f'<p>{toggle} · click a header to sort · off-policy rows in red · a name opens its drill-down{thr}</p>'
            f'<div class="tablewrap"><table id="probe-table" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')
    return section("probes", "Configurations", body)


def _figure_or(sid: str, title: str, make: Any, empty: str, note: str = "", after: str = "") -> str:
    """The figure (and ``after`` it), or the section's title and one line saying why there is none."""
    fig = make()
    if fig is None:
        return section(sid, title, f'<p class="empty">{empty}</p>', empty=True)
    return section(sid, title, _figure(fig, sid) + after, note)


def _memory_notes(probes: dict[str, Any]) -> str:
    """Per probe shown: each GPU's headroom (peak against the card, the estimate beside it) and the verdict on its
    engine's KV cache, the lines ``tunekit probe`` prints."""
    items = []
    for label, p in probes.items():
        lines = [f"GPU {gpu}: {text}" for gpu, text in memory.headroom_lines(p.summary)]
        kv = memory.kv_verdict(p.summary)
        lines += [f"rollout KV cache: {kv}"] if kv else []
        if lines:
            items.append(f"<li><b>{escape(label)}</b>: {escape('; '.join(lines))}</li>")
    return f'<ul class="memory-notes">{"".join(items)}</ul>' if items else ""


def _memory_absence(df: pd.DataFrame, records: Records) -> str:
    if not any(p.summary.get(schema.NVML_AVAILABLE) for p in records.probes):
        return "No GPU memory to show: these probes ran on CPU (no CUDA allocator, no NVML)."
    return "No memory peaks recorded by these probes (older records, or probes that stopped before a steady step)."


def render(records: Records, *, sources: list[str]) -> str:
    """The whole page for ``records`` (read from ``sources``): the headline, then one section per view."""
    every, knobs = data.probe_table(records)  # one row per probe
    df = data.fold_seeds(every, records.searches)  # one row per configuration, its seeds folded in
    head = story.headline(records, df, knobs)
    head |= {"all_probes": len(every), "spend_yuan": float(every["probe_yuan"].sum()) if len(every) else 0.0,
             "hours": data.device_hours(every)}
    best = head["best"]["label"] if head["best"] else None
    base = head["baseline"]["label"] if head["baseline"] else None
    by_label = dict(zip(data.names(records), records.probes))
    bars = {lbl: by_label[lbl] for lbl in data.select_labels(df, MAX_BARS, (best, base))}
    capped = f"Showing the {len(bars)} cheapest of {len(df)} probes; the table has all." if len(df) > len(bars) else ""
    cr = data.cost_reward(df)
    verdicts = checks.policy_verdicts(records, every)
    offpolicy = _offpolicy(verdicts["probes"])
    phases, comm, mem = series.phase_times(bars), series.comm_phases(bars), series.memory(bars)
    comm_labels = data.select_labels(df[df["label"].isin(set(comm["label"]))], MAX_COMM, ())
    comm = comm[comm["label"].isin(comm_labels)]
    hist, imp = story.search_history(records, df), story.importance(records)
    missing = checks.missing_notes(records, every)
    sections = [
        headline(head, offpolicy, len(missing)),
        _cost_section(df, cr, data.varying_knobs(df, knobs), best, offpolicy),
        probe_table(df, knobs, offpolicy),
        confirmation(story.confirmation(records)),
        _figure_or("phases", "Step time by phase", lambda: figures.phase_bars(phases) if len(phases) else None,
                   "No step timings recorded.", f"Median over steady (post-warm-up) steps. {capped}"),
        _figure_or("comm", "Communication: exposed vs total per phase", lambda: figures.comm_bars(comm) if len(comm) else None,
                   escape(series.comm_absence(by_label, df)),
                   f"Grey: all communication kernel time; red: the part not overlapped by compute. Up to {MAX_COMM} cheapest probes. "
                   "On CPU (gloo) only the wait (exposed) time is measured."),
        _figure_or("memory", "Peak memory per GPU: allocator vs NVML", lambda: figures.memory_bars(mem) if len(mem) else None,
                   _memory_absence(df, records),
                   f"Allocator peaks are rank 0's PyTorch caching allocator; NVML is what the GPU reports in use (the gap: vLLM, NCCL, "
                   f"fragmentation, other processes). Hover shows the roles on each GPU. {capped}",
                   after=_memory_notes(bars)),
        _rewards_section(df, every, by_label, (best, base), cr["threshold"]),
        loadtest_section(records.loadtests, records.probes, _figure),
        search_body(hist, imp, head["kind"], lambda fig, name: _figure(fig, name)),
        policy(verdicts),
        drill(records, every),
        section("missing", "What is missing", missing_body(missing), empty=not missing),
    ]
    return _page(records, head, df, sources, [s for s in sections if s])


def _offpolicy(probes: pd.DataFrame) -> dict[str, str]:
    """Label -> why, for the probes whose verdict is off-policy."""
    off = probes[probes["verdict"] == "off-policy"] if len(probes) else pd.DataFrame(columns=["label", "why"])
    return dict(zip(off["label"], off["why"]))


def _cost_section(df: pd.DataFrame, cr: dict[str, Any], varying: list[str], best: str | None,
                  offpolicy: dict[str, str]) -> str:
    """Cost vs reward: every probe at its projected full-run cost, naming those it cannot plot."""
    unplotted = (f"Not drawn (stopped early, so their cost is a bound, or no cost or reward; see the table): "
                 f"{escape(data.few(cr['unplotted']))}." if cr["unplotted"] else "")
    return _figure_or("cost", "Cost vs reward",
                      lambda: figures.cost_reward(cr, varying, best, offpolicy) if len(cr["points"]) else None,
                      "No configuration ran to its end with a projected cost and a reward.",
                      "Each configuration that ran to its end at its projected full-run cost, with its reward (over all "
                      "its seeds when the confirmation round ran it). " + unplotted)


def _rewards_section(df: pd.DataFrame, every: pd.DataFrame, by_label: dict[str, Any], first: tuple[str | None, str | None],
                     threshold: Any) -> str:
    """Reward curves, one per configuration (its seeds' mean with a band): the ``first`` (best, baseline) and the
    next cheapest highlighted."""
    windows = dict(zip(every["label"], every["window"])) if len(every) else {}
    probes = {lbl: c for lbl, p in by_label.items() if len(c := series.reward_curve(p, windows.get(lbl, data.DEFAULT_WINDOW)))}
    config_of = dict(zip(every["label"], every["label"].str.split(" (seed ", regex=False).str[0])) if len(every) else {}
    curves = series.merge_identical(series.per_configuration(probes, config_of))
    merged = {part: name for name in curves for part in name.split(" = ")}
    highlight = list(dict.fromkeys(merged[x] for x in [*first, *data.select_labels(df, len(df), ())] if x in merged))[:MAX_HIGHLIGHT]
    window = int(df["window"].iloc[0]) if len(df) and df["window"].nunique() == 1 else None
    held_out = len(df) and (df["metric"] == schema.EVAL_REWARD_MEAN).all()
    reading = ("the held-out reward at each evaluation (greedy answers to the held-out prompts)" if held_out else
               "the mean over the threshold window")
    return _figure_or("rewards", "Reward curves",
                      lambda: figures.reward_curves(curves, highlight, threshold, window, bool(held_out)) if curves else None,
                      "No reward was logged.",
                      f"Each configuration's reward, {reading} (what is compared with the threshold)"
                      f"{'; at 0 steps, where the probes evaluated before training, the untrained model' if held_out else ''}"
                      "; with several seeds, their mean and a band from the lowest seed to the highest. "
                      f"The answer, the baseline and the next cheapest (up to {MAX_HIGHLIGHT} in all) in colour; "
                      "the rest grey.")


def _page(records: Records, head: dict[str, Any], df: pd.DataFrame, sources: list[str], sections: list[str]) -> str:
    """The sections in the page template, with the nav links, where the records came from, and the title."""
    nav = "".join(f'<a href="#{sid}">{escape(title)}</a>' for sid, title in _nav(sections))
    meta = f"generated {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} from {escape(', '.join(sources))}"
    if records.study is not None:
        meta += f" · study {escape(records.study.name)} in {escape(records.study.storage)}"
    js, _ = plotly_js()
    title = "tunekit report" + ("" if head["kind"]["search"] or not len(df) else " · comparison of runs")
    return Template(TEMPLATE.read_text()).substitute(title=escape(title), meta=meta, nav=nav, plotlyjs=js, body="\n".join(sections))


NAV = {"headline": "Headline", "cost": "Cost vs reward", "probes": "Configurations", "confirm": "Confirmation", "phases": "Step time",
       "comm": "Communication", "memory": "Memory", "rewards": "Reward curves", "search": "Search", "policy": "On-policy",
       "drill": "Drill-down", "missing": "Missing"}


def _nav(sections: list[str]) -> list[tuple[str, str]]:
    """Nav links for the sections present that have content (an empty section is one line and gets no link)."""
    out = []
    for s in sections:
        sid = s.split('id="', 1)[1].split('"', 1)[0]
        if 'class="empty-section"' not in s.split(">", 1)[0] and sid in NAV:
            out.append((sid, NAV[sid]))
    return out
