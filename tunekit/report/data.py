"""Pure functions from loaded records to the tables behind the report's headline, scatter and history.

No I/O, no plotly: each function takes :class:`~tunekit.report.load.Records` (or
its parts) and returns a DataFrame or a plain dict, so every number the report
shows is tested here. Time series live in :mod:`tunekit.report.series`.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tunekit import metrics
from tunekit.config import ProbeConfig, ProfilerConfig, SearchConfig
from tunekit.report.load import Probe, Records
from tunekit.rundir import ABANDONED

FAILED = ("oom", "timeout", "failed", "invalid")
CATEGORIES = ("feasible", "within noise", "infeasible", "ok", "pruned", "incomplete", "failed")
"""feasible / infeasible: finished and judged against the threshold; within noise: the search's interval straddles
it; ok: finished, no threshold known; pruned: stopped early by the search because it could not win on cost."""
OUTCOMES = {"feasible": "feasible", "within noise": "within noise", "infeasible": "below threshold", "ok": "finished",
            "pruned": "pruned on cost", "incomplete": "not finished", "failed": "failed"}
"""The words the report shows for each category."""
LOGPROB_DIFF_WARN = 0.05
"""Mean |rollout - actor| token logprob above this marks a rollout off-policy (a broken weight sync)."""
DEFAULT_WINDOW = SearchConfig.model_fields["reward_window"].default
DEFAULT_WARMUP = ProbeConfig.model_fields["warmup_steps"].default
DEFAULT_COMM_STEPS = ProfilerConfig.model_fields["comm_steps"].default
"""The recipe's defaults, for a config.yaml that lacks the key (one written before it existed)."""
HIDDEN_KNOBS = ("name", "description", "search.space")
"""Config keys not shown as knobs: the recipe name has its own column, the space is the same long list."""

METRICS = {  # table column -> where it comes from in summary.json
    "projected_yuan": "cost/projected_yuan",
    "projected_gpu_hours": "cost/projected_gpu_hours",
    "projected_wall_s": "cost/projected_wall_s",
    "probe_yuan": "cost/probe_yuan",
    "wall_s": "wall_s",
    "steps": "steps",
    "tokens_per_s_per_gpu": metrics.THROUGHPUT,
    "mfu_actor": "perf/mfu/actor",
    "mfu_critic": "perf/mfu/critic",
    "gpus_held": "gpus_held",
}
BASE_COLUMNS = ("label", "order", "trial", "confirmation", "recipe", "status", "reason", "category", "outcome", "reward", "reward_low",
                "reward_high", "threshold", "window", "metric", "ranks", *METRICS, "projected_steps", "run_rule", "step_s", "peak_reserved_gb",
                "nvml_peak_gb", "run_dir", "id", "on_gpu")
TABLE_METRICS = ("reward", "reward_ci", "seeds", "threshold", "projected_yuan", "projected_steps", "projected_gpu_hours",
                 "projected_wall_s", "probe_yuan", "steps", "step_s", "peak_reserved_gb", "nvml_peak_gb",
                 "tokens_per_s_per_gpu", "mfu_actor", "mfu_critic", "reason")
"""Metric columns of the probe table in the order shown (after the knobs); :func:`table_columns` drops the empty ones."""


def edge_samples(samples: pd.DataFrame, key: str = "step") -> list[tuple[int, pd.DataFrame]]:
    """A probe's samples of its first and its last kept step (``key``: or evaluation, by ``trained_steps``), as
    (step, rows); one entry when they are one step, none without samples."""
    if samples.empty or key not in samples:
        return []
    steps = sorted({int(samples[key].min()), int(samples[key].max())})
    return [(s, samples[samples[key] == s]) for s in steps]


def number(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, NaN, text, bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value) if math.isfinite(value) else None


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config → ``{"system.batch.micro_batch_size": 4, ...}``; a device map stays one value
    (:func:`placement`), other lists become compact JSON text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
            out[name] = placement(value)
        elif isinstance(value, dict) and value:
            out |= flatten(value, f"{name}.")
        elif isinstance(value, (list, dict)):
            out[name] = json.dumps(value, separators=(",", ":"))
        else:
            out[name] = value
    return out


def placement(device_map: dict[str, list[Any]]) -> str:
    """A device map in a few words: ``all roles on 0,1`` or ``actor,critic on 0 · rollout on 1``."""
    groups: dict[str, list[str]] = {}
    for role, idx in device_map.items():
        groups.setdefault(",".join(map(str, idx)) or "none", []).append(role)
    if len(groups) == 1:
        return f"all roles on {next(iter(groups))}"
    return " · ".join(f"{','.join(roles)} on {where}" for where, roles in groups.items())


def reward_window(probe: Probe, search: dict[str, Any] | None = None) -> int:
    """Steps whose mean reward is compared with the threshold: the search's window, else the recipe's."""
    for v in ((search or {}).get("reward_window"), (probe.config.get("search") or {}).get("reward_window")):
        if number(v) and v >= 1:
            return int(v)
    return DEFAULT_WINDOW


def reward_metric(probe: Probe) -> str:
    """The reward the search's verdict reads for this probe (its recipe's ``search.reward_metric``)."""
    return (probe.config.get("search") or {}).get("reward_metric") or metrics.REWARD_MEAN


def probe_reward(probe: Probe, window: int | None = None) -> float | None:
    """The search's feasibility reading of the probe (:func:`tunekit.metrics.window_values` of its reward metric over
    the last ``window`` steps; default the recipe's window). None when they hold no finite mean: an infinite reward is
    no reading, never the best one."""
    window = window or reward_window(probe)
    values = metrics.window_values(probe.steps, reward_metric(probe), int(window)) if len(probe.steps) else []
    if values:
        return number(sum(values) / len(values))
    return number(probe.summary.get("reward_last10")) if reward_metric(probe) == metrics.REWARD_MEAN else None


def search_threshold(search: dict[str, Any]) -> float | None:
    return number(search.get("reward_threshold", search.get("threshold")))


def probe_threshold(probe: Probe, search: dict[str, Any] | None = None) -> float | None:
    """The threshold the probe was judged by: its search's, else its own recipe's."""
    found = search_threshold(search) if search else None
    return found if found is not None else number((probe.config.get("search") or {}).get("reward_threshold"))


def normal_verdict(v: Any) -> str | None:
    """A search's per-trial verdict as one of feasible / infeasible / within noise (None for anything else)."""
    text = str(v or "").lower().replace("_", " ").replace("-", " ").strip()
    return text if text in ("feasible", "infeasible", "within noise") else None


def classify(status: str | None, reward: float | None, threshold: float | None, feasible: bool | None = None,
             verdict: str | None = None) -> str:
    """One of :data:`CATEGORIES`; ``verdict`` / ``feasible`` are the search's own reading when it recorded one."""
    if status in FAILED:
        return "failed"
    if status == "pruned":
        return "pruned"
    if status != "ok":
        return "incomplete"
    if normal_verdict(verdict):
        return normal_verdict(verdict)
    if feasible is not None:
        return "feasible" if feasible else "infeasible"
    if threshold is None:
        return "ok"
    return "feasible" if reward is not None and reward >= threshold else "infeasible"


def outcome(category: str, status: str) -> str:
    """The word a reader sees: ``below threshold`` rather than ok, ``failed (oom)`` rather than failed."""
    return f"failed ({status})" if category == "failed" and status not in ("failed", "") else OUTCOMES[category]


def search_trials(searches: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(search, trial) of every search.json trial keyed by run directory name; duplicates point at their original."""
    out = {}
    for s in searches:
        for t in s.get("trials") or []:
            if isinstance(t, dict) and t.get("run_dir") and t.get("duplicate_of") is None:
                out[Path(str(t["run_dir"])).name] = (s, t)
    return out


def confirmation_runs(searches: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(search, probe entry) of every confirmation-round probe keyed by run directory name."""
    out = {}
    for s in searches:
        conf = s.get("confirmation") if isinstance(s.get("confirmation"), dict) else {}
        for p in conf.get("probes") or []:
            if isinstance(p, dict) and p.get("run_dir"):
                out[Path(str(p["run_dir"])).name] = (s, p)
    return out


def pruned_bounds(records: Records) -> dict[str, tuple[float, int]]:
    """(projected yuan, step) at which the search pruned each probe, from its study, keyed by run directory name."""
    if records.study is None:
        return {}
    return {Path(str(t["run_dir"])).name: t["bound"] for t in records.study.trials
            if t.get("run_dir") and t.get("bound") and t.get("state") == "pruned" and number(t["bound"][0]) is not None}


def trial_value(t: dict[str, Any]) -> float | None:
    """The objective (projected yuan) of a search.json trial; older files call it ``value``."""
    return number(t.get("projected_yuan", t.get("value")))


def trial_name(search: dict[str, Any] | None, number_: Any, several: bool) -> str:
    """``trial 3``, as ``tunekit search`` prints it; ``<study> trial 3`` when the report holds several searches."""
    study = (search or {}).get("study") or Path(str((search or {}).get("_dir", ""))).name
    return f"{study} trial {number_}" if several and study else f"trial {number_}"


def names(records: Records) -> list[str]:
    """One name per probe, in start order, as ``tunekit search`` prints it: ``trial 3``, a confirmation probe
    ``trial 3 (seed 1)`` (a partner probe ``trial 3 (seed 1, again on its pair's machine)``); a probe the study
    holds that search.json does not yet (a trial still running) by the study's number; a probe of no search
    ``run N`` (N from 1)."""
    linked, confirming = search_trials(records.searches), confirmation_runs(records.searches)
    several = sum(bool(s.get("trials")) for s in records.searches) > 1
    in_study = {Path(str(t["run_dir"])).name: t for t in (records.study.trials if records.study else []) if t.get("run_dir")}
    out: list[str] = []
    for i, p in enumerate(records.probes):
        search, trial = linked.get(p.id, (None, None))
        csearch, entry = confirming.get(p.id, (None, None))
        if trial and trial.get("number") is not None:
            name = trial_name(search, trial.get("number"), several)
        elif entry and entry.get("trial") is not None:
            again = ", again on its pair's machine" if entry.get("partner") else ""
            name = f"{trial_name(csearch, entry['trial'], several)} (seed {entry.get('seed')}{again})"
        elif p.id in in_study and not several:
            name = f"trial {in_study[p.id]['number']}"
        else:
            name = f"run {i + 1}"
        out.append(name if name not in out else f"{name} ({p.id})")
    return out


def ranks(config: dict[str, Any]) -> int:
    """Devices (ranks on CPU) the probe's device map places its roles on; 1 without a device map."""
    placed = {i for idx in ((config.get("system") or {}).get("device_map") or {}).values() for i in (idx or [])}
    return max(1, len(placed))


def reward_ci(trial: dict[str, Any]) -> tuple[float | None, float | None]:
    """The search's interval on a trial's own probe's reward (the table's): ``[low, high]`` or ``{"low": ..,
    "high": ..}``; for a trial that took an earlier trial's reward (the same learning), its own probe's interval;
    (None, None) if absent."""
    ci = trial.get("own_reward_ci") or trial.get("reward_ci")
    if isinstance(ci, dict):
        ci = [ci.get("low", ci.get("lo")), ci.get("high", ci.get("hi"))]
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return number(ci[0]), number(ci[1])
    return None, None


def projection(summary: dict[str, Any], trial: dict[str, Any], status: str, bound: tuple[float, int] | None) -> dict[str, Any]:
    """The projected full run the report shows for a probe, on the search's scale when there is a search.

    A finished trial: the search's own projection (a search that sizes each run by its work says how many steps,
    and gives no cost to a run that never reaches the threshold). A pruned trial: the projection it was pruned at.
    A search's trial that ended otherwise (a timeout, a failure): none, as the search priced it. Otherwise the probe's
    own projection (``probe.target_steps``). GPU-hours and wall time only where they belong to the same run length.
    """
    own = {col: number(summary.get(METRICS[col])) for col in ("projected_yuan", "projected_gpu_hours", "projected_wall_s")}
    by_work = "projected_steps" in trial and number(trial.get("projected_steps")) != number(summary.get("cost/target_steps"))
    if by_work:  # the probe's own figures are for another run length
        own |= {"projected_gpu_hours": number(trial.get("projected_gpu_hours")), "projected_wall_s": number(trial.get("projected_wall_s"))}
    if status == "ok" and ("projected_yuan" in trial or "value" in trial):
        own["projected_yuan"] = trial_value(trial)
    elif status == "pruned" and bound is not None:
        own |= {"projected_yuan": float(bound[0]), "projected_gpu_hours": None, "projected_wall_s": None}
    elif trial and status not in ("ok", "pruned"):  # the search gave it no price: neither does the report
        own = dict.fromkeys(own)
    return own


def probe_table(records: Records) -> tuple[pd.DataFrame, list[str]]:
    """One row per probe (cheapest feasible first) and the knob columns, in config order."""
    linked, confirming = search_trials(records.searches), confirmation_runs(records.searches)
    bounds = pruned_bounds(records)
    rows, knob_order = [], {}
    for order, (label, p) in enumerate(zip(names(records), records.probes)):
        s, (search, trial) = p.summary, linked.get(p.id, (None, {}))
        if not trial and p.id in confirming:  # judged by its own reward: the round's verdict is per configuration
            search = confirming[p.id][0]
        window, threshold = reward_window(p, search), probe_threshold(p, search)
        reward = probe_reward(p, window)
        feasible = trial.get("feasible") if isinstance(trial.get("feasible"), bool) else None
        status = str(s.get("status") or trial.get("status") or "unknown")
        if str(s.get("reason") or "").startswith(ABANDONED):  # stopped with its search part, probed again: no failure
            status = "stopped"
        category = classify(status, reward, threshold, feasible, trial.get("verdict"))
        steady = s.get("steady") if isinstance(s.get("steady"), dict) else {}
        knobs = {k: v for k, v in flatten(p.config).items() if k not in HIDDEN_KNOBS}
        knob_order |= dict.fromkeys(knobs)
        low, high = reward_ci(trial)
        row = {
            "label": label, "order": order, "trial": trial.get("number", (confirming.get(p.id) or ({}, {}))[1].get("trial")),
            "confirmation": p.id in confirming,
            "recipe": str(s.get("recipe") or p.config.get("name") or p.id), "status": status,
            "reason": str(s.get("reason") or trial.get("reason") or ""), "category": category,
            "outcome": outcome(category, status), "reward": reward, "reward_low": low, "reward_high": high,
            "threshold": threshold, "window": window, "metric": reward_metric(p), "ranks": ranks(p.config),
            **{col: number(s.get(key)) for col, key in METRICS.items()}, **projection(s, trial, status, bounds.get(p.id)),
            "projected_steps": number(trial.get("projected_steps", s.get("cost/projected_steps"))),
            "run_rule": str(trial.get("run_rule") or ""),
            "step_s": number(steady.get(metrics.TIMING_STEP)),
            "peak_reserved_gb": number(steady.get(metrics.MAX_RESERVED_GB)),
            "nvml_peak_gb": nvml_peak(s),
            "run_dir": str(p.run_dir), "id": p.id, "on_gpu": ran_on_gpu(s, p.config),
        }
        rows.append(row | {f"knob:{k}": v for k, v in knobs.items()})
    if not rows:
        return pd.DataFrame(columns=BASE_COLUMNS), []
    df = pd.DataFrame(rows)
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    df = df.assign(_r=df["category"].map(rank)).sort_values(["_r", "projected_yuan", "order"], na_position="last")
    return df.drop(columns="_r").reset_index(drop=True), [f"knob:{k}" for k in knob_order]


def table_columns(df: pd.DataFrame) -> list[str]:
    """The metric columns worth a column: :data:`TABLE_METRICS` with a value in some row; the threshold only
    when probes differ in it (else the caption says it), ``reward_ci`` when the search recorded intervals."""
    cols = []
    for col in TABLE_METRICS:
        if col == "reward_ci":
            keep = "reward_low" in df and df["reward_low"].notna().any()
        elif col == "threshold":
            keep = df["threshold"].nunique(dropna=False) > 1
        elif col in ("reason", "seeds"):
            keep = col in df and df[col].astype(bool).any()
        else:
            keep = col in df and pd.to_numeric(df[col], errors="coerce").notna().any()
        if keep:
            cols.append(col)
    return cols


def varying_knobs(df: pd.DataFrame, knobs: list[str]) -> list[str]:
    """Knob columns whose value is not the same in every probe (absent counts as a value)."""
    def distinct(col: pd.Series) -> int:
        return len({json.dumps(v, default=str) if not is_missing(v) else "<missing>" for v in col})

    return [k for k in knobs if k in df and distinct(df[k]) > 1]


def is_missing(v: Any) -> bool:
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


FINISHED = ("feasible", "within noise", "infeasible", "ok")
"""Categories of a probe that ran to its end: the ones the cost-vs-reward chart draws."""
LABELLED_POINTS = 30
"""Up to this many points, the scatter names each one beside it."""


def point_labels(points: pd.DataFrame, near: tuple[float, float] = (0.08, 0.05)) -> dict[str, str]:
    """The label beside each point, keyed by probe name: probes whose points lie within ``near`` of the axes' spans
    of each other (x, y: about a label's width and height on the chart) share one label on the first of them, so no
    label overlaps another. Empty above :data:`LABELLED_POINTS` points."""
    if len(points) > LABELLED_POINTS or points.empty:
        return {}
    x, y = points["projected_yuan"].astype(float), points["reward"].astype(float)
    dx, dy = (x.max() - x.min()) or 1.0, (y.max() - y.min()) or 1.0
    spots: list[list[Any]] = []
    for cx, cy, label in zip(x, y, points["label"]):
        spot = next((s for s in spots if abs(s[0] - cx) <= near[0] * dx and abs(s[1] - cy) <= near[1] * dy), None)
        if spot is None:
            spots.append([cx, cy, str(label), [str(label)]])
        else:
            spot[3].append(str(label))
    return {first: " · ".join(names) for _, _, first, names in spots}


def cost_reward(df: pd.DataFrame) -> dict[str, Any]:
    """Points per category for the scatter, the Pareto front (finished probes) and the threshold line."""
    if df.empty:
        return {"points": df, "front": [], "threshold": None, "unplotted": [], "labels": {}}
    finished = df[df["category"].isin(FINISHED)]
    idx = pareto_front(finished["projected_yuan"].tolist(), finished["reward"].tolist())
    front = finished.iloc[idx]["label"].tolist()
    # a pruned or failed probe stopped early: its projection is a bound, not a price, and would stretch the axis
    plotted = df["projected_yuan"].notna() & df["reward"].notna() & df["category"].isin(FINISHED)
    thresholds = df["threshold"].dropna()
    return {
        "points": df[plotted], "front": front, "labels": point_labels(df[plotted]),
        "threshold": float(Counter(thresholds).most_common(1)[0][0]) if len(thresholds) else None,
        "unplotted": df.loc[~plotted, "label"].tolist(),
    }


def as_list(v: Any) -> list[Any]:
    if v in (None, "", [], {}):
        return []
    return v if isinstance(v, list) else [v]


def anchor(label: str) -> str:
    """An HTML id fragment for a probe name (``trial 3`` → ``trial-3``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(label)).strip("-")


def few(items: list[str], limit: int = 12) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def select_labels(df: pd.DataFrame, limit: int, keep: tuple[str | None, ...] = ()) -> list[str]:
    """The first ``limit`` probes in table order (cheapest feasible first), plus ``keep`` (best, baseline)."""
    chosen = df["label"].head(limit).tolist() if len(df) else []
    return chosen + [k for k in keep if k and k not in chosen]


def nvml_peak(summary: Mapping[str, Any]) -> float | None:
    """The highest NVML memory peak of any GPU the summary records (None: NVML sampled none)."""
    return max((v for k, v in summary.items() if k.startswith("nvml/mem_used_gb/") and number(v) is not None),
               default=None)


def ran_on_gpu(summary: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether a probe ran on a GPU: it held one, as its summary says; NVML sampled it; or, for a summary that says
    neither, its configuration asked for CUDA."""
    held = number(summary.get("gpus_held")) or 0
    return held > 0 or nvml_peak(summary) is not None or (config.get("system") or {}).get("device") == "cuda"


def device_hours(df: pd.DataFrame) -> str:
    """What a projected hour of the table's probes is an hour of: ``GPU-hours`` when some probe ran on a GPU (its
    ``on_gpu``, :func:`ran_on_gpu`), else ``CPU-hours``."""
    return "GPU-hours" if "on_gpu" in df and df["on_gpu"].fillna(False).astype(bool).any() else "CPU-hours"


def fold_seeds(df: pd.DataFrame, searches: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per configuration: a confirmation round's probes fold into their trial's row, which then carries the
    round's reward, interval and verdict over all its seeds (``seeds`` names them), and the round's projected full
    run (the probes its paired cost ratios compare) — the figures the search's answer quotes. Without a round, the probes as they are (``seeds`` empty)."""
    out = df.assign(seeds="")
    if df.empty:
        return out
    for s in searches:
        conf = s.get("confirmation") if isinstance(s.get("confirmation"), dict) else {}
        for c in conf.get("configurations") or []:
            at = out.index[(out["trial"] == c.get("trial")) & ~out["confirmation"].astype(bool)]
            low, high = reward_ci(c)
            verdict = normal_verdict(c.get("verdict"))
            if not len(at) or number(c.get("reward")) is None or verdict is None:
                continue
            i = at[0]
            out.loc[i, ["reward", "reward_low", "reward_high"]] = [float(c["reward"]), low, high]
            out.loc[i, "seeds"] = ", ".join(map(str, c.get("seeds") or []))
            priced = [col for col in ("projected_yuan", "projected_gpu_hours", "projected_wall_s") if number(c.get(col)) is not None]
            out.loc[i, priced] = [float(c[col]) for col in priced]
            if out.loc[i, "category"] in ("feasible", "within noise", "infeasible"):
                out.loc[i, "category"] = verdict
                out.loc[i, "outcome"] = outcome(verdict, str(out.loc[i, "status"]))
    folded = out[~out["confirmation"].astype(bool)]
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    return (folded.assign(_r=folded["category"].map(rank)).sort_values(["_r", "projected_yuan", "order"], na_position="last")
            .drop(columns="_r").reset_index(drop=True))
