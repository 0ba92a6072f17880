"""Pure functions from loaded probes to the per-configuration bars and per-step series of the report.

Steady-state numbers come from ``summary.json``'s ``steady`` block (medians over
post-warm-up steps, peaks for memory); records too old to have it fall back to
the same medians over ``steps.parquet``. Long series are downsampled here so a
report of hundreds of probes stays small.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tunekit.report.data import number
from tunekit.report.load import Probe

PHASES = ("gen", "reward", "ref", "old_logprob", "values", "adv", "update_critic", "update_actor", "update_weights")
MAX_POINTS = 200
"""Points per drill-down or reward series; buckets keep the mean (peaks keep the max)."""
NVML_METRICS = ("mem_used_gb", "util_gpu", "power_w")


def steady(probe: Probe) -> dict[str, float]:
    """The probe's steady medians: summary ``steady`` when recorded, else medians over steps past warm-up."""
    recorded = probe.summary.get("steady")
    if isinstance(recorded, dict) and recorded:
        return {k: float(v) for k, v in recorded.items() if number(v) is not None}
    if probe.steps.empty:
        return {}
    warmup = int((probe.config.get("probe") or {}).get("warmup_steps", 3))
    rows = probe.steps.iloc[warmup:] if len(probe.steps) > warmup else probe.steps
    cols = [c for c in rows.columns if c.startswith(("timing_s/", "perf/", "comm/"))]
    agg = {c: (rows[c].max() if c.startswith("perf/max_memory_") else rows[c].median()) for c in cols}
    return {k: float(v) for k, v in agg.items() if number(v) is not None}


def phase_times(probes: dict[str, Probe]) -> pd.DataFrame:
    """Median steady seconds per phase, one row per probe label; ``other`` = step minus the phases."""
    rows = []
    for label, p in probes.items():
        st = steady(p)
        row = {ph: st.get(f"timing_s/{ph}", 0.0) for ph in PHASES}
        step = st.get("timing_s/step")
        if step is None and not any(row.values()):
            continue
        row["other"] = max(0.0, step - sum(row.values())) if step is not None else 0.0
        rows.append({"label": label, **row, "step": step if step is not None else sum(row.values())})
    return pd.DataFrame(rows, columns=["label", *PHASES, "other", "step"]).set_index("label")


def comm_phases(probes: dict[str, Probe]) -> pd.DataFrame:
    """Long rows (label, phase, total_s, exposed_s): steady communication per phase.

    On CPU (gloo) only ``comm/wait_s`` exists; it is exposed time by definition and
    ``total_s`` stays NaN.
    """
    rows = []
    for label, p in probes.items():
        st = steady(p)
        for ph in PHASES:
            total, exposed = st.get(f"comm/total_s/{ph}"), st.get(f"comm/exposed_s/{ph}", st.get(f"comm/wait_s/{ph}"))
            if total is None and exposed is None:
                continue
            rows.append({"label": label, "phase": ph, "total_s": total if total is not None else math.nan,
                         "exposed_s": exposed if exposed is not None else math.nan})
    df = pd.DataFrame(rows, columns=["label", "phase", "total_s", "exposed_s"])
    measured = df[["total_s", "exposed_s"]].fillna(0).gt(0).any(axis=1).groupby(df["label"]).transform("any")
    return df[measured].reset_index(drop=True)  # a single-rank probe records zero everywhere: nothing to show


def gpu_roles(config: dict[str, Any]) -> dict[int, list[str]]:
    """Device index → roles placed on it, from ``system.device_map``."""
    out: dict[int, list[str]] = {}
    for role, idx in ((config.get("system") or {}).get("device_map") or {}).items():
        for i in idx or []:
            out.setdefault(int(i), []).append(role)
    return out


def memory(probes: dict[str, Probe]) -> pd.DataFrame:
    """Long rows (label, series, gpu, gb, roles): allocator peaks (rank 0's GPU) and NVML peak per GPU."""
    rows = []
    for label, p in probes.items():
        st, roles = steady(p), gpu_roles(p.config)
        first = min(roles) if roles else 0
        for kind in ("allocated", "reserved"):
            gb = st.get(f"perf/max_memory_{kind}_gb")
            if gb is not None:
                rows.append({"label": label, "series": f"allocator {kind}", "gpu": first, "gb": gb,
                             "roles": ", ".join(roles.get(first, []))})
        for key, gb in p.summary.items():
            if key.startswith("nvml/mem_used_gb/") and number(gb) is not None:
                gpu = int(key.rsplit("/", 1)[1]) if key.rsplit("/", 1)[1].isdigit() else -1
                rows.append({"label": label, "series": f"NVML GPU {gpu}", "gpu": gpu, "gb": float(gb),
                             "roles": ", ".join(roles.get(gpu, []))})
    return pd.DataFrame(rows, columns=["label", "series", "gpu", "gb", "roles"])


def downsample(df: pd.DataFrame, max_points: int = MAX_POINTS, *, x: str, peaks: tuple[str, ...] = ()) -> pd.DataFrame:
    """At most ``max_points`` rows: equal buckets of consecutive rows, first ``x``, max of ``peaks``, mean of the rest."""
    if len(df) <= max_points:
        return df.reset_index(drop=True)
    size = math.ceil(len(df) / max_points)
    starts = np.arange(0, len(df), size)
    out = {}
    for col in df.select_dtypes("number").columns:
        v = df[col].to_numpy(dtype=float)
        if col == x:
            out[col] = v[starts]
        elif col in peaks:
            out[col] = np.fmax.reduceat(v, starts)
        else:  # NaN-aware mean per bucket
            ok = ~np.isnan(v)
            n = np.add.reduceat(ok.astype(float), starts)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[col] = np.add.reduceat(np.where(ok, v, 0.0), starts) / np.where(n > 0, n, np.nan)
    return pd.DataFrame(out)


def reward_curve(probe: Probe, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """(step, reward) of one probe, downsampled; empty when the probe logged no reward."""
    s = probe.steps
    if s.empty or "reward/mean" not in s:
        return pd.DataFrame(columns=["step", "reward"])
    df = pd.DataFrame({"step": s["step"] if "step" in s else range(len(s)), "reward": s["reward/mean"]}).dropna()
    return downsample(df, max_points, x="step")


def drilldown(probe: Probe, max_points: int = MAX_POINTS) -> dict[str, pd.DataFrame]:
    """Per-step phase times and allocator memory, and NVML samples per GPU (seconds from the first sample)."""
    s = probe.steps
    step = s["step"] if "step" in s else pd.Series(range(len(s)), index=s.index)
    timing = [c for c in (*(f"timing_s/{ph}" for ph in PHASES), "timing_s/step") if c in s]
    mem = [c for c in ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb") if c in s]
    out = {
        "timing": downsample(pd.concat([step.rename("step"), s[timing]], axis=1), max_points, x="step") if timing else pd.DataFrame(),
        "memory": downsample(pd.concat([step.rename("step"), s[mem]], axis=1), max_points, x="step", peaks=tuple(mem)) if mem else pd.DataFrame(),
        "nvml": pd.DataFrame(),
    }
    n = probe.nvml
    if not n.empty and {"time", "gpu"} <= set(n.columns):
        t = pd.to_numeric(n["time"]) / 1e9 if pd.api.types.is_datetime64_any_dtype(n["time"]) else n["time"]
        n = n.assign(t=t - t.min()).sort_values("t")
        cols = ["t", "gpu", *[c for c in NVML_METRICS if c in n]]
        parts = [downsample(g[cols], max_points, x="t", peaks=("mem_used_gb",)).assign(gpu=gpu) for gpu, g in n.groupby("gpu")]
        out["nvml"] = pd.concat(parts, ignore_index=True)
    return out
