"""Pure checks over loaded records: on-policy or not per probe, equivalence warnings, and what the records lack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tunekit import metrics
from tunekit.report.data import LOGPROB_DIFF_WARN, as_list, few, number
from tunekit.report.load import Records

EXPECTED_SUMMARY = ("status", "recipe", "steps", "wall_s", "gpus_held", "reward_last10", "cost/probe_yuan",
                    "cost/projected_yuan", "cost/projected_gpu_hours", "cost/projected_wall_s", "startup_s", "steady")
EXPECTED_STEADY = (metrics.TIMING_STEP,)
EXPECTED_STEADY_GPU = (metrics.MAX_RESERVED_GB,)
"""Allocator peaks exist only for CUDA probes (NVML available)."""
EXPECTED_STEPS = ("step", metrics.REWARD_MEAN, metrics.TIMING_STEP)


def policy_verdicts(records: Records, df: pd.DataFrame) -> dict[str, Any]:
    """Per probe: on-policy or off-policy and why; plus every equivalence warning recorded."""
    by_id = dict(zip(df["id"], df["label"])) if len(df) else {}
    by_dir = dict(zip(df["run_dir"], df["label"])) if len(df) else {}
    rows = []
    for p in records.probes:
        s = p.summary
        stale = number(s.get(metrics.STALENESS))
        if stale is None and metrics.STALENESS in p.steps:
            stale = number(p.steps[metrics.STALENESS].max())
        diff = None
        if metrics.LOGPROB_DIFF in p.steps:
            diff = number(p.steps[metrics.LOGPROB_DIFF].median())
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
        for w in as_list(s.get("equivalence")):
            rows[-1]["why"] = "; ".join(filter(None, [rows[-1]["why"], _text(w)]))
    warnings = [_text(w) for srch in records.searches for w in as_list(srch.get("equivalence"))]
    checks = []
    for srch in records.searches:
        learn = srch.get("learning") if isinstance(srch.get("learning"), dict) else {}
        if "pairs_compared" in learn:
            scope = learn.get("scope") or "trials"
            checks.append(f"{learn['pairs_compared']} pair(s) of {scope} that differ only in systems knobs compared; "
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
            if key.startswith("cost/projected_") and p.summary.get("cost/run_rule"):
                continue  # the run rule says why there is no projection (the reward never reached the threshold)
            if key not in p.summary:
                lacking.setdefault(f"summary.json has no {key}", []).append(label)
        for key in EXPECTED_STEADY + (EXPECTED_STEADY_GPU if p.summary.get(metrics.NVML_AVAILABLE) else ()):
            if steady and key not in steady:
                lacking.setdefault(f"summary.json steady has no {key}", []).append(label)
        for col in EXPECTED_STEPS:
            if len(p.steps) and col not in p.steps:
                lacking.setdefault(f"steps.parquet has no column {col}", []).append(label)
    notes = [f"{what}: {few(who)}" for what, who in lacking.items()]
    if records.searches and not any(s.get("trials") for s in records.searches):
        notes.append("search.json has no trials list; history is read from the study or the probes.")
    return notes + records.notes
