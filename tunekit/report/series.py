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

from tunekit import metrics
from tunekit.report.data import DEFAULT_COMM_STEPS, DEFAULT_WARMUP, DEFAULT_WINDOW, number, ran_on_gpu, reward_metric
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
    warmup = int((probe.config.get("probe") or {}).get("warmup_steps", DEFAULT_WARMUP))
    rows = probe.steps.iloc[warmup:] if len(probe.steps) > warmup else probe.steps
    cols = [c for c in rows.columns if c.startswith(("timing_s/", "perf/", "comm/"))]
    agg = {c: (rows[c].max() if c.startswith("perf/max_memory_") else rows[c].median()) for c in cols}
    return {k: float(v) for k, v in agg.items() if number(v) is not None}


def phase_times(probes: dict[str, Probe]) -> pd.DataFrame:
    """Median steady seconds per phase, one row per probe label; ``other`` = step minus the phases."""
    rows = []
    for label, p in probes.items():
        st = steady(p)
        row = {ph: st.get(metrics.timing(ph), 0.0) for ph in PHASES}
        step = st.get(metrics.TIMING_STEP)
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
            total, exposed = st.get(f"comm/total_s/{ph}"), st.get(f"comm/exposed_s/{ph}", st.get(metrics.comm_wait(ph)))
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


def reward_curve(probe: Probe, window: int = DEFAULT_WINDOW, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """(step, reward, smooth) of one probe, downsampled: the reward its search's verdict reads
    (:func:`tunekit.report.data.reward_metric`). For the training batch's, ``smooth`` is the mean of the last
    ``window`` steps at each step (fewer at the start); for the held-out one, each evaluation as recorded, at the
    steps trained when it ran (``step`` + 1), the one before training (``eval/reward_before``) at 0. Empty without
    that reward."""
    s, metric = probe.steps, reward_metric(probe)
    if s.empty or metric not in s:
        return pd.DataFrame(columns=["step", "reward", "smooth"])
    df = pd.DataFrame({"step": s["step"] if "step" in s else range(len(s)), "reward": s[metric]}).dropna()
    if metric != metrics.EVAL_REWARD_MEAN:
        df["smooth"] = df["reward"].rolling(max(1, int(window)), min_periods=1).mean()
        return downsample(df, max_points, x="step")
    df["step"] += 1
    before = probe.summary.get(metrics.EVAL_REWARD_BEFORE)
    if isinstance(before, (int, float)) and math.isfinite(before):
        df = pd.concat([pd.DataFrame({"step": [0], "reward": [float(before)]}), df], ignore_index=True)
    return downsample(df.assign(smooth=df["reward"]), max_points, x="step")


def comm_absence(probes: dict[str, Probe], df: pd.DataFrame) -> str:
    """Why the communication chart is empty, in one sentence, from the probes' device maps, outcomes and profiler settings.

    ``df`` is the probe table (label, ranks, status, steps).
    """
    multi = df[df["label"].isin(set(probes)) & (df["ranks"] > 1)] if len(df) else df
    if multi.empty:
        return "No communication: every probe ran on a single rank, so there was none to measure."
    names = ", ".join(multi["label"].astype(str))
    stopped = multi[multi["status"] != "ok"]
    if len(stopped) == len(multi):
        prof = (probes[multi["label"].iloc[0]].config.get("profiler") or {})
        probe = (probes[multi["label"].iloc[0]].config.get("probe") or {})
        comm_steps, start, planned = prof.get("comm_steps", DEFAULT_COMM_STEPS), prof.get("comm_start_step"), probe.get("steps")
        when = (f"from step {start}" if start is not None else f"in the last {comm_steps} of {planned} steps" if planned else "late")
        last = int(stopped["steps"].max()) if stopped["steps"].notna().any() else 0
        how = ", ".join(sorted(set(stopped["outcome"]))) if "outcome" in stopped else "pruned or failed"
        return (f"No communication measured: the multi-rank probes ({names}) stopped early ({how}) by step {last}, "
                f"before communication is sampled ({when}).")
    if any(k.startswith("comm/") and k != metrics.COMM_SAMPLED for lbl in multi["label"] for k in steady(probes[lbl])):
        return f"The multi-rank probes ({names}) measured no communication time (zero in every phase)."
    off = [lbl for lbl in multi["label"] if not (probes[lbl].config.get("profiler") or {}).get("comm_steps", DEFAULT_COMM_STEPS)]
    if len(off) == len(multi):
        return f"No communication measured: profiler.comm_steps is 0 in the multi-rank probes ({names})."
    return (f"No communication recorded by the multi-rank probes ({names}): their runner or controller "
            "does not profile collectives (the single controller's Ray workers are not profiled).")


def drilldown(probe: Probe, max_points: int = MAX_POINTS) -> dict[str, pd.DataFrame]:
    """Per-step phase times and allocator memory, and NVML samples per GPU (seconds from the first sample)."""
    s = probe.steps
    step = s["step"] if "step" in s else pd.Series(range(len(s)), index=s.index)
    timing = [c for c in (*(metrics.timing(ph) for ph in PHASES), metrics.TIMING_STEP) if c in s]
    mem = [c for c in (metrics.MAX_ALLOCATED_GB, metrics.MAX_RESERVED_GB) if c in s]
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


DRILL_GROUPS = ("run", "cost", "timings", "memory", "communication", "throughput", "GC pauses", "learning", "profiler", "other")
_UNITS = (  # (key prefix, group, unit, scale), first match wins
    ("cost/yuan_per_step", "cost", "¥/step", 1.0), ("cost/probe_yuan", "cost", "¥", 1.0), ("cost/projected_yuan", "cost", "¥", 1.0),
    ("cost/probe_gpu_hours", "cost", "GPU-h", 1.0), ("cost/projected_gpu_hours", "cost", "GPU-h", 1.0),
    ("cost/projected_wall_s", "cost", "s", 1.0), ("cost/target_steps", "cost", "steps", 1.0),
    ("cost/projected_steps", "cost", "steps", 1.0), ("cost/", "cost", "", 1.0),
    ("timing_s/", "timings", "s", 1.0), ("perf/gc_s", "GC pauses", "s", 1.0), ("perf/gc_full", "GC pauses", "per step", 1.0),
    ("wall_s", "timings", "s", 1.0), ("startup_s", "timings", "s", 1.0), ("startup/start_key", "run", "", 1.0),
    ("startup/", "timings", "s", 1.0),
    ("first_step/", "timings", "s", 1.0), ("compile/graph_captures", "timings", "graphs", 1.0),
    ("compile/graphs", "timings", "graphs", 1.0),
    ("compile/", "timings", "s", 1.0), ("compile_cache/", "run", "", 1.0),
    ("perf/max_memory_", "memory", "GB", 1.0), ("nvml/mem_used_gb/", "memory", "GB", 1.0),
    ("comm/wait_s/", "communication", "s", 1.0), ("comm/exposed_s/", "communication", "s", 1.0),
    ("comm/total_s/", "communication", "s", 1.0), ("comm/", "communication", "", 1.0),
    (metrics.THROUGHPUT, "throughput", "tokens/s/GPU", 1.0), ("perf/mfu/", "throughput", "%", 100.0),
    (metrics.TOTAL_TOKENS, "throughput", "tokens/step", 1.0), (metrics.ENERGY_J, "throughput", "kJ", 1e-3),
    ("nvml/", "memory", "", 1.0), ("reward", "learning", "", 1.0), ("rollout/", "learning", "", 1.0),
    ("profiler/overhead_share", "profiler", "%", 100.0), (metrics.PROFILER_OVERHEAD_S, "profiler", "s", 1.0), ("profiler/", "profiler", "", 1.0),
    ("status", "run", "", 1.0), ("recipe", "run", "", 1.0), ("steps", "run", "", 1.0), ("gpus_held", "run", "", 1.0),
    ("profile", "run", "", 1.0), ("steady_from_step", "run", "", 1.0), ("outcome", "run", "", 1.0),
)


def unit_of(key: str) -> tuple[str, str, float]:
    """(group, unit, scale) of a summary key: ``timing_s/gen`` → timings, s; ``perf/mfu/actor`` → throughput, %, x100."""
    for prefix, group, unit, scale in _UNITS:
        if key.startswith(prefix):
            return group, unit, scale
    return "other", "", 1.0


def drill_groups(probe: Probe, outcome: str | None = None) -> dict[str, list[tuple[str, Any, str]]]:
    """The probe's summary as (name, value, unit) rows per group of :data:`DRILL_GROUPS`, steady medians among them
    (their unit says ``median`` or ``peak``), phases in loop order.

    Values are scaled to the unit (hours, %, kJ); nested records and the free-text reason stay out. With the report's
    ``outcome`` (``below threshold``) first, a finished probe's ``status: ok`` is left out: it would read as a verdict.
    """
    skip = {"steady", "reason", "equivalence"} | ({"status"} if outcome and probe.summary.get("status") == "ok" else set())
    rows = [("outcome", outcome, "")] if outcome else []
    rows += [(k, v, "") for k, v in probe.summary.items() if k not in skip and not isinstance(v, dict)]
    rows += [(k, v, "peak" if k.startswith("perf/max_memory") else "median") for k, v in steady(probe).items() if k != metrics.COMM_SAMPLED]
    phase_rank = {ph: i for i, ph in enumerate((*PHASES, "step"))}
    rows.sort(key=lambda r: (r[0].rsplit("/", 1)[0], phase_rank.get(r[0].rsplit("/", 1)[-1], -1)) if "/" in r[0] else ("", -1))
    out: dict[str, list[tuple[str, Any, str]]] = {g: [] for g in DRILL_GROUPS}
    cpu = not ran_on_gpu(probe.summary, probe.config)  # its devices are CPU ranks: hours and throughput are theirs
    for key, value, stat in rows:
        group, unit, scale = unit_of(key)
        if cpu:
            unit = unit.replace("GPU-h", "CPU-h").replace("/GPU", "/rank")
        if isinstance(value, list):
            value = ", ".join(map(str, value))
        elif number(value) is not None and scale != 1.0:
            value = value * scale
        out[group].append((key, value, f"{unit} ({stat})" if stat and unit else stat or unit))
    return {g: r for g, r in out.items() if r}


def per_configuration(curves: dict[str, pd.DataFrame], config_of: dict[str, str]) -> dict[str, pd.DataFrame]:
    """Each configuration's smoothed reward over its seeds' probes (``config_of``: probe name -> configuration name):
    (step, smooth, low, high, seeds) with the mean over seeds and the lowest and highest seed at each step the seeds
    share; one seed gives its own curve with no band."""
    groups: dict[str, list[pd.Series]] = {}
    for label, c in curves.items():
        groups.setdefault(config_of.get(label, label), []).append(c.set_index("step")["smooth"])
    out = {}
    for name, seeds in groups.items():
        m = pd.concat(seeds, axis=1, join="inner")
        out[name] = pd.DataFrame({"step": m.index, "smooth": m.mean(axis=1).to_numpy(), "low": m.min(axis=1).to_numpy(),
                                  "high": m.max(axis=1).to_numpy(), "seeds": len(seeds)})
    return out


def merge_identical(curves: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Configurations whose curves agree at every step (systems variants that learn alike, step for step) as one curve
    named ``trial 12 = trial 9``, so no curve hides under another."""
    out: dict[str, pd.DataFrame] = {}
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # out's (step, smooth), read once: a search has hundreds
    for label, c in curves.items():
        step, smooth = c["step"].to_numpy(), c["smooth"].to_numpy()
        twin = next((k for k, (s, m) in arrays.items() if len(s) == len(step) and (s == step).all()
                     and np.allclose(m, smooth)), None)
        if twin is None:
            out[label], arrays[label] = c, (step, smooth)
        else:
            merged = f"{twin} = {label}"
            out[merged], arrays[merged] = out.pop(twin), arrays.pop(twin)
    return out
