"""Pure functions from the probe table to the headline, the search history and the confirmation round.

Whether the report is one search or a comparison of runs is decided here, once:
a search has a baseline, a saving and a history; a comparison of unrelated runs
has neither.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from tunekit.report.data import as_list, classify, cost_reward, is_missing, number, reward_ci, search_trials, trial_value
from tunekit.report.load import Records


def report_kind(records: Records, df: pd.DataFrame) -> dict[str, Any]:
    """``search``: every probe is a trial of one search (a probe it has not recorded yet counts when its recipe is
    the search's); else a comparison of runs. Also the recipes the runs come from."""
    recipes = sorted(set(df["recipe"])) if len(df) else []
    searches = [s for s in records.searches if s.get("trials")]
    if len(searches) == 1:
        linked = search_trials(searches)
        is_search = all(i in linked for i in df["id"]) or recipes == [searches[0].get("recipe")]
    elif not searches and records.study is not None:
        runs = {Path(str(t.get("run_dir") or "")).name for t in records.study.trials}
        is_search = all(i in runs for i in df["id"])
    else:
        is_search = False
    return {"search": is_search, "recipes": recipes, "runs": len(df)}


def _pick(df: pd.DataFrame, entry: dict[str, Any] | None) -> pd.Series | None:
    if not entry or not entry.get("run_dir"):
        return None
    hit = df[df["id"] == Path(str(entry["run_dir"])).name]
    return hit.iloc[0] if len(hit) else None


def stop_sentence(reason: Any) -> str | None:
    """How the search ended, as a sentence; a search.json written between trials says ``running``."""
    if not reason:
        return None
    if str(reason) == "running":
        return "The search had not finished when this report was made (still running, or stopped before its last trial)."
    return f"The search stopped: {reason}."


def headline(records: Records, df: pd.DataFrame, knobs: list[str]) -> dict[str, Any]:
    """The best feasible probe, the baseline, the saving and the command, from search.json when there is one.

    A comparison of runs of several recipes has no baseline and no saving: the runs were not sampled from one space.
    """
    kind = report_kind(records, df)
    search = next((s for s in records.searches if s.get("best") or s.get("baseline")), {}) if kind["search"] else {}
    notes = [str(n) for s in records.searches for n in as_list(s.get("notes"))] if kind["search"] else []
    out: dict[str, Any] = {
        "kind": kind, "probes": len(df), "counts": dict(Counter(df["outcome"])) if len(df) else {},
        "spend_yuan": float(df["probe_yuan"].sum()) if len(df) else 0.0,
        "threshold": cost_reward(df)["threshold"], "thresholds": int(df["threshold"].nunique()) if len(df) else 0,
        "best": None, "baseline": None, "changes": [],
        "saving_yuan": None, "saving_pct": None, "command": search.get("command"), "source": "search.json" if search else "probes",
        "notes": notes, "stop": stop_sentence(search.get("stop_reason")),
        "answer": str(search.get("answer") or ""), "verdict": str(search.get("verdict") or ""),
        "named": _named(search), "reaches": search.get("reaches") if isinstance(search.get("reaches"), dict) else None,
        "search_spent_yuan": number(search.get("spent_yuan")),
    }
    if df.empty:
        return out
    feasible = df[df["category"] == "feasible"].dropna(subset=["projected_yuan"])
    best = _pick(df, search.get("best")) if search else None
    if best is None and len(feasible):
        best = feasible.sort_values("projected_yuan").iloc[0]
    base = _pick(df, search.get("baseline")) if search else None
    if base is None and not search and len(kind["recipes"]) == 1:
        base = df.sort_values("order").iloc[0]  # the first run is the configuration the user started from
    out["best"], out["baseline"] = _brief(best), _brief(base)
    if best is None:
        ok = df[df["reward"].notna()]
        out["top_reward"] = _brief(ok.sort_values("reward").iloc[-1]) if len(ok) else None
        return out
    if base is not None:
        out["changes"] = [(k.removeprefix("knob:"), base[k], best[k]) for k in knobs
                          if json.dumps(base[k], default=str) != json.dumps(best[k], default=str)]
    if "saving_yuan" in search:  # the search's word, also its None for a baseline that never reached the threshold
        out["saving_yuan"], out["saving_pct"] = number(search.get("saving_yuan")), number(search.get("saving_pct"))
    elif base is not None and number(base["projected_yuan"]) and number(best["projected_yuan"]) is not None:
        out["saving_yuan"] = base["projected_yuan"] - best["projected_yuan"]
        out["saving_pct"] = 100.0 * out["saving_yuan"] / base["projected_yuan"]
    if not out["command"]:
        priced = next((p.summary.get("cost/target_steps") for p in records.probes if str(p.run_dir) == str(best["run_dir"])), None)
        target = int(priced) if number(priced) else None  # the full run the probe's projection priced
        out["command"] = f"tunekit probe --recipe {best['run_dir']}/config.yaml" + (f" --steps {target}" if target else "")
    return out


def _named(search: dict[str, Any]) -> dict[str, Any] | None:
    """The confirmation round's final verdict when it names two configurations it could not tell apart, else None."""
    conf = search.get("confirmation") if isinstance(search.get("confirmation"), dict) else {}
    named = [n for n in as_list(conf.get("named")) if isinstance(n, int)]
    if len(named) < 2:
        return None
    return {"trials": named, "final_verdict": str(conf.get("final_verdict") or ""), "baseline": conf.get("baseline")}


def _brief(row: pd.Series | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keys = ("label", "trial", "recipe", "status", "category", "outcome", "reward", "reward_low", "reward_high", "threshold",
            "window", "projected_yuan", "projected_steps", "projected_gpu_hours", "projected_wall_s", "probe_yuan", "run_dir")
    return {k: (None if is_missing(row.get(k)) else row.get(k)) for k in keys}


HISTORY_COLUMNS = ["number", "label", "state", "category", "value", "value_from", "feasible", "reason", "duplicate_of",
                   "best_so_far"]


def search_history(records: Records, df: pd.DataFrame) -> dict[str, Any]:
    """Trials in order, each at its projected cost, with the search's answer so far as search.json records it (the
    search's own rule; none from a study alone); from search.json, else the study.

    A pruned trial has no objective value; it is drawn at the projection its own probe records give
    (``value_from`` says so), never at the cheap end of the axis. A trial with no projection at all
    (it failed before a step) has ``value`` None. Empty when there is no search.
    """
    rows_by_id = {r.id: r for r in df.itertuples()} if len(df) else {}
    trials = [t for s in records.searches for t in (s.get("trials") or []) if isinstance(t, dict)]
    source = "search.json"
    if not trials and records.study is not None:
        trials, source = records.study.trials, f"Optuna study {records.study.name}"
    bounds = {st["number"]: st["bound"] for st in (records.study.trials if records.study else [])
              if st.get("bound") and st.get("state") == "pruned"}
    retried = {t.get("retry_of"): t.get("number") for t in trials if t.get("retry_of") is not None}
    rows = []
    for i, t in enumerate(trials):
        probe = rows_by_id.get(Path(str(t.get("run_dir") or "")).name)
        state = str(t.get("status") or t.get("state", "")).lower()
        value, value_from = trial_value(t), "objective"
        bound = bounds.get(t.get("number"))
        if value is None and bound is not None:
            value, value_from = float(bound[0]), f"the search's projection when it pruned it, after {bound[1]} steps"
        elif value is None and probe is not None and number(probe.projected_yuan) is not None:
            value, value_from = probe.projected_yuan, f"its probe's projection after {probe.steps:.0f} steps" if number(probe.steps) else "its probe's projection"
        feasible = t.get("feasible") if isinstance(t.get("feasible"), bool) else None
        category = probe.category if probe is not None else classify(
            {"complete": "ok", "fail": "failed"}.get(state, state), None, None, feasible, t.get("verdict"))
        if category in ("incomplete", "failed") and t.get("number") in retried:
            how = "deferred, probed as" if state == "deferred" else "stopped, retried as"
            category, state = "incomplete", f"{how} trial {retried[t.get('number')]}"
        rows.append({"number": t.get("number", i), "label": probe.label if probe is not None else "", "state": state,
                     "category": category, "value": value if value is not None else None,
                     "value_from": value_from if value is not None else "", "feasible": feasible,
                     "reason": str(t.get("reason") or ""), "duplicate_of": t.get("duplicate_of"),
                     "best_so_far": number(t.get("best_so_far"))})
    if source == "search.json" and rows and not any("best_so_far" in t for t in trials):
        for row, y in zip(rows, _answers_so_far(trials, records.searches)):
            row["best_so_far"] = y
    hist = pd.DataFrame(rows, columns=HISTORY_COLUMNS).sort_values("number").reset_index(drop=True)
    return {"trials": hist, "source": source if rows else ""}


def _answers_so_far(trials: list[dict[str, Any]], searches: list[dict[str, Any]]) -> list[float | None]:
    """The answer after each trial of a search.json written before it recorded one: by the search's own rule where
    its rows carry their reward intervals (:func:`tunekit.search.answer.answers_so_far`), else the cheapest trial the
    record calls feasible so far."""
    threshold = number(next((s.get("reward_threshold", s.get("threshold")) for s in searches), None))
    if threshold is not None and all("reward_ci" in t and "number" in t for t in trials):
        from tunekit.search.answer import answers_so_far

        return answers_so_far(trials, threshold=threshold, seed=0)
    out, best = [], None
    for t in trials:
        v = trial_value(t)
        if t.get("feasible") is True and v is not None and (best is None or v < best):
            best = v
        out.append(best)
    return out


def importance(records: Records) -> dict[str, Any]:
    if records.study is None:
        return {"values": None, "note": "no Optuna study found (give a search output directory with study.db, "
                                        "or --storage URL --study NAME)."}
    return {"values": records.study.importance, "note": records.study.importance_note}


SHOWN_PER_CONFIG = {"trial", "name", "baseline", "reward", "reward_ci", "seeds", "verdict", "projected_steps", "sets",
                    "projected_yuan", "projected_gpu_hours", "projected_wall_s", "priced_rounds"}
"""Fields of a confirmation configuration the table shows in its own columns (or leaves out: the knobs are above)."""


def confirmation(records: Records) -> dict[str, Any] | None:
    """The search's confirmation round (re-probes of the top candidates and the baseline, alternating, fresh seeds):
    its answer, one row per configuration with the paired cost ratio against the baseline, and its other facts.
    None when the search recorded no round; fields it lacks are left out."""
    found = next((s["confirmation"] for s in records.searches if isinstance(s.get("confirmation"), dict) and s["confirmation"]), None)
    if found is None:
        return None
    ratios = found.get("ratios_vs_baseline") if isinstance(found.get("ratios_vs_baseline"), dict) else {}
    paired = found.get("paired") if isinstance(found.get("paired"), dict) else {}
    against = paired.get(str(found.get("baseline"))) if isinstance(paired.get(str(found.get("baseline"))), dict) else {}
    ratios = against | ratios  # a reference's ratio against the baseline beside the candidates'
    configs = found.get("configurations")
    if not isinstance(configs, list):  # another shape: its first list of records
        configs = next((v for v in found.values() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)), [])
    rows = []
    for c in (c for c in configs if isinstance(c, dict)):  # one row per configuration, its seeds folded in
        low, high = reward_ci(c)
        reward = number(c.get("reward"))
        name = f"trial {c['trial']}" if "trial" in c else str(c.get("name", ""))
        row = {"configuration": name + (" (baseline)" if c.get("baseline") is True else ""),
               "reward over its seeds": " ".join(filter(None, [f"{reward:.3f}" if reward is not None else "",
                                                               f"[{low:.3f}, {high:.3f}]" if low is not None else ""])) or None,
               "seeds": ", ".join(map(str, c["seeds"])) if isinstance(c.get("seeds"), list) else None,
               "verdict": c.get("verdict"), "run steps": c.get("projected_steps"),
               "projected ¥ (its round probes)": f"¥{c['projected_yuan']:.4g}" if number(c.get("projected_yuan")) is not None else None}
        cost = (ratios.get(str(c.get("trial"))) or {}).get("cost") if isinstance(ratios.get(str(c.get("trial"))), dict) else None
        if isinstance(cost, dict) and number(cost.get("ratio")) is not None:
            ci = cost.get("ci") if isinstance(cost.get("ci"), list) and len(cost["ci"]) == 2 else None
            row["cost vs baseline"] = f"{cost['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        extra = {k: v for k, v in c.items() if isinstance(v, (str, int, float, bool)) and k not in SHOWN_PER_CONFIG}
        rows.append({k: v for k, v in (row | extra).items() if v is not None})
    facts = {}
    if number(found.get("spent_yuan")) is not None:
        facts["spent"] = f"its probes cost ¥{found['spent_yuan']:.4g}"
    if found.get("cut_short"):
        facts["cut short"] = str(found["cut_short"])
    spread = found.get("round_spread") if isinstance(found.get("round_spread"), dict) else {}
    if number(spread.get("sd_log_ratio")) is not None:
        facts["noise"] = (f"paired cost ratios move {100 * spread['sd_log_ratio']:.1f}% (sd) from round to round "
                          f"({spread.get('df')} df)")
    return {"sentence": found.get("sentence"), "verdict": found.get("verdict"), "winner": found.get("winner"),
            "running": bool(found.get("running")), "probes": len(found.get("probes") or []), "facts": facts,
            "rows": pd.DataFrame(rows)}
