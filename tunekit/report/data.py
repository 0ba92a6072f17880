"""Pure functions from loaded records to the tables behind the report's headline, scatter and history.

No I/O, no plotly: each function takes :class:`~tunekit.report.load.Records` (or
its parts) and returns a DataFrame or a plain dict, so every number the report
shows is tested here. Time series live in :mod:`tunekit.report.series`.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from tunekit.report.load import Probe, Records

FAILED = ("oom", "timeout", "failed", "invalid")
CATEGORIES = ("feasible", "infeasible", "ok", "pruned", "incomplete", "failed")
"""feasible / infeasible: finished and judged against the threshold; ok: finished, no threshold known;
pruned: stopped early by the search because it could not win on cost."""
LOGPROB_DIFF_WARN = 0.05
"""Mean |rollout - actor| token logprob above this marks a rollout off-policy (a broken weight sync)."""
HIDDEN_KNOBS = ("name", "description", "search.space")
"""Config keys not shown as knobs: the recipe name has its own column, the space is the same long list."""

METRICS = {  # table column -> where it comes from in summary.json
    "projected_yuan": "cost/projected_yuan",
    "projected_gpu_hours": "cost/projected_gpu_hours",
    "projected_wall_s": "cost/projected_wall_s",
    "probe_yuan": "cost/probe_yuan",
    "wall_s": "wall_s",
    "steps": "steps",
    "tokens_per_s_per_gpu": "perf/throughput",
    "mfu_actor": "perf/mfu/actor",
    "mfu_critic": "perf/mfu/critic",
}
BASE_COLUMNS = ("label", "trial", "recipe", "status", "reason", "category", "reward", "threshold", *METRICS, "step_s",
                "peak_reserved_gb", "nvml_peak_gb", "run_dir", "id")
EXPECTED_SUMMARY = ("status", "recipe", "steps", "wall_s", "gpus_held", "reward_last10", "cost/probe_yuan",
                    "cost/projected_yuan", "cost/projected_gpu_hours", "cost/projected_wall_s", "startup_s", "steady")
EXPECTED_STEADY = ("timing_s/step",)
EXPECTED_STEADY_GPU = ("perf/max_memory_reserved_gb",)
"""Allocator peaks exist only for CUDA probes (NVML available)."""
EXPECTED_STEPS = ("step", "reward/mean", "timing_s/step")


def number(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, NaN, text, bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value) if math.isfinite(value) else None


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config → ``{"system.batch.micro_batch_size": 4, ...}``; lists become compact JSON text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{name}.")
        elif isinstance(value, (list, dict)):
            out[name] = json.dumps(value, separators=(",", ":"))
        else:
            out[name] = value
    return out


def probe_reward(probe: Probe) -> float | None:
    """Mean reward of the last ``search.reward_window`` steps (the search's feasibility reading)."""
    window = (probe.config.get("search") or {}).get("reward_window") or 10
    if "reward/mean" in probe.steps and len(probe.steps):
        tail = probe.steps["reward/mean"].dropna().tail(int(window))
        if len(tail):
            return float(tail.mean())
    return number(probe.summary.get("reward_last10"))


def search_threshold(search: dict[str, Any]) -> float | None:
    return number(search.get("reward_threshold", search.get("threshold")))


def probe_threshold(probe: Probe, searches: list[dict[str, Any]]) -> float | None:
    for s in searches:
        if search_threshold(s) is not None:
            return search_threshold(s)
    return number((probe.config.get("search") or {}).get("reward_threshold"))


def classify(status: str | None, reward: float | None, threshold: float | None, feasible: bool | None = None) -> str:
    """One of :data:`CATEGORIES`; ``feasible`` is the search's own verdict when it recorded one."""
    if status in FAILED:
        return "failed"
    if status == "pruned":
        return "pruned"
    if status != "ok":
        return "incomplete"
    if feasible is not None:
        return "feasible" if feasible else "infeasible"
    if threshold is None:
        return "ok"
    return "feasible" if reward is not None and reward >= threshold else "infeasible"


def search_trials(searches: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Trials of every search.json keyed by run directory name (run ids are unique); duplicates point at their original."""
    out = {}
    for s in searches:
        for t in s.get("trials") or []:
            if isinstance(t, dict) and t.get("run_dir") and t.get("duplicate_of") is None:
                out[Path(str(t["run_dir"])).name] = t
    return out


def trial_value(t: dict[str, Any]) -> float | None:
    """The objective (projected yuan) of a search.json trial; older files call it ``value``."""
    return number(t.get("projected_yuan", t.get("value")))


def labels(probes: list[Probe]) -> list[str]:
    """Short stable names ``P00``, ``P01``... in start order (run ids begin with a timestamp)."""
    width = max(2, len(str(len(probes) - 1)))
    return [f"P{i:0{width}d}" for i in range(len(probes))]


def probe_table(records: Records) -> tuple[pd.DataFrame, list[str]]:
    """One row per probe (cheapest feasible first) and the knob columns, in config order."""
    trials = search_trials(records.searches)
    rows, knob_order = [], {}
    for label, p in zip(labels(records.probes), records.probes):
        s, trial = p.summary, trials.get(p.id, {})
        reward, threshold = probe_reward(p), probe_threshold(p, records.searches)
        feasible = trial.get("feasible") if isinstance(trial.get("feasible"), bool) else None
        steady = s.get("steady") if isinstance(s.get("steady"), dict) else {}
        knobs = {k: v for k, v in flatten(p.config).items() if k not in HIDDEN_KNOBS}
        knob_order |= dict.fromkeys(knobs)
        row = {
            "label": label, "trial": trial.get("number"), "recipe": str(s.get("recipe") or p.config.get("name") or p.id),
            "status": str(s.get("status") or "unknown"), "reason": str(s.get("reason") or trial.get("reason") or ""),
            "category": classify(s.get("status"), reward, threshold, feasible), "reward": reward, "threshold": threshold,
            **{col: number(s.get(key)) for col, key in METRICS.items()},
            "step_s": number(steady.get("timing_s/step")),
            "peak_reserved_gb": number(steady.get("perf/max_memory_reserved_gb")),
            "nvml_peak_gb": max((v for k, v in s.items() if k.startswith("nvml/mem_used_gb/") and number(v) is not None), default=None),
            "run_dir": str(p.run_dir), "id": p.id,
        }
        rows.append(row | {f"knob:{k}": v for k, v in knobs.items()})
    if not rows:
        return pd.DataFrame(columns=BASE_COLUMNS), []
    df = pd.DataFrame(rows)
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    df = df.assign(_r=df["category"].map(rank)).sort_values(["_r", "projected_yuan", "label"], na_position="last")
    return df.drop(columns="_r").reset_index(drop=True), [f"knob:{k}" for k in knob_order]


def varying_knobs(df: pd.DataFrame, knobs: list[str]) -> list[str]:
    """Knob columns whose value is not the same in every probe (absent counts as a value)."""
    def distinct(col: pd.Series) -> int:
        return len({json.dumps(v, default=str) if not _missing(v) else "<missing>" for v in col})

    return [k for k in knobs if k in df and distinct(df[k]) > 1]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def pareto_front(costs: list[float | None], rewards: list[float | None]) -> list[int]:
    """Indices of points no other point beats on both cheaper-or-equal cost and higher-or-equal reward.

    Returned in increasing cost; points missing either value are never on the front.
    """
    pts = sorted((c, -r, i) for i, (c, r) in enumerate(zip(costs, rewards)) if number(c) is not None and number(r) is not None)
    front, best = [], -math.inf
    for cost, neg_reward, i in pts:
        if -neg_reward > best:
            front.append(i)
            best = -neg_reward
    return front


def cost_reward(df: pd.DataFrame) -> dict[str, Any]:
    """Points per category for the scatter, the Pareto front (finished probes) and the threshold line."""
    if df.empty:
        return {"points": df, "front": [], "threshold": None, "unplotted": []}
    finished = df[df["category"].isin(("feasible", "infeasible", "ok"))]
    idx = pareto_front(finished["projected_yuan"].tolist(), finished["reward"].tolist())
    front = finished.iloc[idx]["label"].tolist()
    plotted = df["projected_yuan"].notna() & df["reward"].notna()
    thresholds = df["threshold"].dropna()
    return {
        "points": df[plotted], "front": front,
        "threshold": float(Counter(thresholds).most_common(1)[0][0]) if len(thresholds) else None,
        "unplotted": df.loc[~plotted, "label"].tolist(),
    }


def _pick(df: pd.DataFrame, entry: dict[str, Any] | None) -> pd.Series | None:
    if not entry or not entry.get("run_dir"):
        return None
    hit = df[df["id"] == Path(str(entry["run_dir"])).name]
    return hit.iloc[0] if len(hit) else None


def headline(records: Records, df: pd.DataFrame, knobs: list[str]) -> dict[str, Any]:
    """The best feasible probe, the baseline, the saving and the command, from search.json when there is one."""
    search = next((s for s in records.searches if s.get("best") or s.get("baseline")), {})
    notes = [str(n) for s in records.searches for n in _as_list(s.get("notes"))]
    counts = Counter(df["status"]) if not df.empty else Counter()
    out: dict[str, Any] = {
        "probes": len(df), "counts": dict(counts), "spend_yuan": float(df["probe_yuan"].sum()) if len(df) else 0.0,
        "threshold": cost_reward(df)["threshold"], "best": None, "baseline": None, "changes": [],
        "saving_yuan": None, "saving_pct": None, "command": search.get("command"), "source": "search.json" if search else "probes",
        "notes": notes, "stop_reason": search.get("stop_reason"),
    }
    if df.empty:
        return out
    feasible = df[df["category"] == "feasible"].dropna(subset=["projected_yuan"])
    best = _pick(df, search.get("best")) if search else None
    if best is None and len(feasible):
        best = feasible.sort_values("projected_yuan").iloc[0]
    base = _pick(df, search.get("baseline")) if search else None
    if base is None and not search:
        base = df.sort_values("label").iloc[0]  # the first probe run is the configuration the user started from
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
        target = int(best["knob:probe.target_steps"]) if number(best.get("knob:probe.target_steps")) else None
        out["command"] = f"tunekit probe --recipe {best['run_dir']}/config.yaml" + (f" --steps {target}" if target else "")
    return out


def _brief(row: pd.Series | None) -> dict[str, Any] | None:
    if row is None:
        return None
    keys = ("label", "trial", "recipe", "status", "category", "reward", "threshold", "projected_yuan",
            "projected_gpu_hours", "projected_wall_s", "probe_yuan", "run_dir")
    return {k: (None if _missing(row.get(k)) else row.get(k)) for k in keys}


def search_history(records: Records, df: pd.DataFrame) -> dict[str, Any]:
    """Trials in order with the best feasible value so far; from search.json, else the study, else the probes."""
    by_id = dict(zip(df["id"], df["label"])) if len(df) else {}
    trials = [t for s in records.searches for t in (s.get("trials") or []) if isinstance(t, dict)]
    source = "search.json"
    if not trials and records.study is not None:
        trials, source = records.study.trials, f"Optuna study {records.study.name}"
    if trials:
        rows = [{"number": t.get("number", i), "state": str(t.get("status") or t.get("state", "")).lower(), "value": trial_value(t),
                 "feasible": t.get("feasible") if isinstance(t.get("feasible"), bool) else None,
                 "label": by_id.get(Path(str(t.get("run_dir") or "")).name, ""), "reason": str(t.get("reason") or "")}
                for i, t in enumerate(trials)]
    else:
        source = "probes in start order (no search.json or study)"
        ordered = df.sort_values("label") if len(df) else df
        rows = [{"number": i, "state": "complete" if r.status == "ok" else r.status, "value": r.projected_yuan,
                 "feasible": {"feasible": True, "infeasible": False}.get(r.category), "label": r.label, "reason": r.reason}
                for i, r in enumerate(ordered.itertuples())]
    hist = pd.DataFrame(rows, columns=["number", "state", "value", "feasible", "label", "reason"])
    hist = hist.sort_values("number").reset_index(drop=True)
    hist["best_so_far"] = best_so_far(hist["value"].tolist(), hist["feasible"].tolist())
    return {"trials": hist, "source": source}


def best_so_far(values: list[float | None], feasible: list[bool | None]) -> list[float | None]:
    """Running minimum over feasible trials with a value (None until the first one)."""
    out, best = [], None
    for v, ok in zip(values, feasible):
        if ok and number(v) is not None and (best is None or v < best):
            best = v
        out.append(best)
    return out


def importance(records: Records) -> dict[str, Any]:
    if records.study is None:
        return {"values": None, "note": "no Optuna study found (give a search output directory with study.db, "
                                        "or --storage URL --study NAME)."}
    return {"values": records.study.importance, "note": records.study.importance_note}


def policy_verdicts(records: Records, df: pd.DataFrame) -> dict[str, Any]:
    """Per probe: on-policy or off-policy and why; plus every equivalence warning recorded."""
    by_id = dict(zip(df["id"], df["label"])) if len(df) else {}
    by_dir = dict(zip(df["run_dir"], df["label"])) if len(df) else {}
    rows = []
    for p in records.probes:
        s = p.summary
        stale = number(s.get("rollout/staleness_steps"))
        if stale is None and "rollout/staleness_steps" in p.steps:
            stale = number(p.steps["rollout/staleness_steps"].max())
        diff = None
        if "rollout/logprob_abs_diff_mean" in p.steps:
            diff = number(p.steps["rollout/logprob_abs_diff_mean"].median())
        reasons = []
        if stale:
            reasons.append(f"rollout weights {stale:g} step(s) stale")
        if diff is not None and diff > LOGPROB_DIFF_WARN:
            reasons.append(f"rollout vs actor logprob diff {diff:.3g} > {LOGPROB_DIFF_WARN}")
        known = stale is not None or diff is not None
        rows.append({"label": by_dir.get(str(p.run_dir), p.id), "backend": ((p.config.get("system") or {}).get("rollout") or {}).get("backend"),
                     "staleness_steps": stale, "logprob_abs_diff": diff,
                     "verdict": "off-policy" if reasons else ("on-policy" if known else "not measured"),
                     "why": "; ".join(reasons)})
        for w in _as_list(s.get("equivalence")):
            rows[-1]["why"] = "; ".join(filter(None, [rows[-1]["why"], _text(w)]))
    warnings = [_text(w) for srch in records.searches for w in _as_list(srch.get("equivalence"))]
    checks = []
    for srch in records.searches:
        learn = srch.get("learning") if isinstance(srch.get("learning"), dict) else {}
        if "pairs_compared" in learn:
            checks.append(f"{learn['pairs_compared']} pair(s) of feasible trials that differ only in systems knobs compared; "
                          f"{len(learn.get('mismatches') or [])} learned differently ({learn.get('method', '')}).")
        for m in learn.get("mismatches") or []:
            warnings.append(_text(m.get("sentence", m)) if isinstance(m, dict) else _text(m))
            _mark_mismatch(rows, m, srch, by_id)
    return {"probes": pd.DataFrame(rows), "warnings": [w for w in warnings if w], "checks": checks}


def _mark_mismatch(rows: list[dict[str, Any]], m: Any, search: dict[str, Any], by_id: dict[str, str]) -> None:
    """Flag both probes of a learning mismatch (trial numbers → run dirs → labels) as off-policy in red."""
    if not isinstance(m, dict):
        return
    runs = {t.get("number"): Path(str(t.get("run_dir") or "")).name for t in search.get("trials") or [] if isinstance(t, dict)}
    pair = (m.get("trial_a"), m.get("trial_b"))
    for own, other in (pair, pair[::-1]):
        label = by_id.get(runs.get(own, ""))
        for row in rows:
            if label and row["label"] == label:
                row["verdict"] = "off-policy"
                row["why"] = "; ".join(filter(None, [row["why"], f"learns differently from trial {other}"]))


def _as_list(v: Any) -> list[Any]:
    if v in (None, "", [], {}):
        return []
    return v if isinstance(v, list) else [v]


def _text(v: Any) -> str:
    if isinstance(v, dict):
        return "; ".join(f"{k}: {x}" for k, x in v.items())
    return str(v)


def missing_notes(records: Records, df: pd.DataFrame) -> list[str]:
    """What older or broken records lack, one line per missing thing with the probes that lack it."""
    by_dir = dict(zip(df["run_dir"], df["label"])) if len(df) else {}
    lacking: dict[str, list[str]] = {}
    for p in records.probes:
        label = by_dir.get(str(p.run_dir), p.id)
        if p.summary.get("status") == "running":
            continue  # still writing its files
        for m in p.missing:
            lacking.setdefault(m, []).append(label)
        if p.summary.get("status") != "ok" or not p.summary:
            continue  # a failed probe lacks costs by nature
        steady = p.summary.get("steady") if isinstance(p.summary.get("steady"), dict) else {}
        for key in EXPECTED_SUMMARY:
            if key not in p.summary:
                lacking.setdefault(f"summary.json has no {key}", []).append(label)
        for key in EXPECTED_STEADY + (EXPECTED_STEADY_GPU if p.summary.get("nvml/available") else ()):
            if steady and key not in steady:
                lacking.setdefault(f"summary.json steady has no {key}", []).append(label)
        for col in EXPECTED_STEPS:
            if len(p.steps) and col not in p.steps:
                lacking.setdefault(f"steps.parquet has no column {col}", []).append(label)
    notes = [f"{what}: {few(who)}" for what, who in lacking.items()]
    if records.searches and not any(s.get("trials") for s in records.searches):
        notes.append("search.json has no trials list; history is read from the study or the probes.")
    return notes + records.notes


def few(items: list[str], limit: int = 12) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def select_labels(df: pd.DataFrame, limit: int, keep: tuple[str | None, ...] = ()) -> list[str]:
    """The first ``limit`` probes in table order (cheapest feasible first), plus ``keep`` (best, baseline)."""
    chosen = df["label"].head(limit).tolist() if len(df) else []
    return chosen + [k for k in keep if k and k not in chosen]
