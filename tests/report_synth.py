"""Synthetic run directories in the record format a probe writes (config.yaml, summary.json, steps/nvml.parquet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tunekit.config import dump_recipe, load_recipe

PHASES = ("gen", "reward", "ref", "old_logprob", "values", "adv", "update_critic", "update_actor", "update_weights")


def write_run(root: Path, run_id: str, *, status: str = "ok", reason: str = "", reward: float = 0.6, yuan: float = 10.0,
              overrides: tuple[str, ...] = (), steps: int = 100, gpus: int = 1, nvml_samples: int = 300,
              seed: int = 0, drop_summary: tuple[str, ...] = (), drop_steps: tuple[str, ...] = (),
              extra: dict[str, Any] | None = None) -> Path:
    """One run dir; ``status`` other than ok writes what a probe that died leaves (no costs, few steps)."""
    rng = np.random.default_rng(seed)
    run = Path(root) / run_id
    run.mkdir(parents=True)
    recipe = load_recipe(None, list(overrides))
    (run / "config.yaml").write_text(dump_recipe(recipe))
    n = steps if status == "ok" else steps // 10
    phase_s = {ph: 0.05 + 0.02 * i for i, ph in enumerate(PHASES)}
    rows = []
    for step in range(n):
        row: dict[str, Any] = {"step": step, "reward/mean": float(np.clip(0.2 + (reward - 0.2) * step / max(1, n - 1) + rng.normal(0, 0.03), 0, 1))}
        for ph, t in phase_s.items():
            row[f"timing_s/{ph}"] = t * (1 + 0.05 * rng.standard_normal())
        row["timing_s/step"] = sum(row[f"timing_s/{ph}"] for ph in PHASES) * 1.05
        row["perf/max_memory_allocated_gb"] = 20 + rng.random()
        row["perf/max_memory_reserved_gb"] = 24 + rng.random()
        row["rollout/logprob_abs_diff_mean"] = 0.01 + 0.001 * rng.random()
        row["actor/pg_loss"], row["critic/vf_loss"] = rng.normal(), rng.random()
        if step in (3, 4, 5):
            row |= {"comm/total_s/update_actor": 0.04, "comm/exposed_s/update_actor": 0.01, "comm/wait_s/update_actor": 0.01,
                    "comm/total_s/gen": 0.02, "comm/exposed_s/gen": 0.015, "comm/wait_s/gen": 0.015}
        rows.append({k: v for k, v in row.items() if k not in drop_steps})
    if rows:
        pd.DataFrame(rows).to_parquet(run / "steps.parquet", index=False)
    frame = pd.DataFrame(rows)
    steady = {c: float(frame[c].iloc[3:].max() if c.startswith("perf/max_memory") else frame[c].iloc[3:].median())
              for c in frame.columns if c.startswith(("timing_s/", "perf/", "comm/")) and len(frame) > 3}
    summary: dict[str, Any] = {
        "status": status, "reason": reason, "recipe": recipe.name, "steps": n, "steps_planned": steps,
        "wall_s": 60.0 + n, "gpus_held": gpus, "reward_first10": float(frame["reward/mean"].head(10).mean()) if n else None,
        "reward_last10": float(frame["reward/mean"].tail(10).mean()) if n else None, "profile": "h200",
        "cost/probe_yuan": 0.01 * (60 + n) * gpus, "cost/probe_gpu_hours": (60 + n) * gpus / 3600,
        "startup_s": 20.0, "steady": steady, "comm/method": "cuda kernels", "nvml/available": nvml_samples > 0,
    }
    if status == "ok":
        summary |= {"cost/projected_yuan": yuan, "cost/projected_gpu_hours": yuan / 20, "cost/projected_wall_s": yuan / 20 * 3600 / gpus,
                    "cost/yuan_per_step": yuan / 1000, "cost/target_steps": 1000}
    if nvml_samples:
        t0 = 1.7e9
        nv = pd.DataFrame([{"time": t0 + 0.2 * i, "gpu": g, "mem_used_gb": 30 + 5 * rng.random(), "util_gpu": 100 * rng.random(),
                            "power_w": 300 + 100 * rng.random(), "sm_clock_mhz": 1980.0}
                           for i in range(nvml_samples) for g in range(gpus)])
        nv.to_parquet(run / "nvml.parquet", index=False)
        summary |= {f"nvml/mem_used_gb/{g}": float(nv[nv.gpu == g]["mem_used_gb"].max()) for g in range(gpus)}
        summary["nvml/energy_j"] = 1e5
    summary |= extra or {}
    (run / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k not in drop_summary}))
    return run


def write_search(root: Path, runs: list[Path], *, best: int, baseline: int, threshold: float = 0.5, legacy: bool = False,
                 **extra: Any) -> Path:
    """A search.json over ``runs`` (trial i = runs[i]) as ``tunekit search`` writes it; ``legacy``: the older field names."""
    trials = []
    for i, r in enumerate(runs):
        s = json.loads((r / "summary.json").read_text())
        ok = s["status"] == "ok"
        value = s.get("cost/projected_yuan") if ok else None
        t = {"number": i, "state": "COMPLETE", "baseline": i == baseline, "params": {}, "sets": [], "status": s["status"],
             "reason": s.get("reason", ""), "projected_yuan": value, "reward": s.get("reward_last10"),
             "feasible": ok and (s.get("reward_last10") or 0) >= threshold, "probe_yuan": s.get("cost/probe_yuan"),
             "wall_s": s.get("wall_s"), "run_dir": str(r), "duplicate_of": None, "retry_of": None, "worker": "w0"}
        if legacy:
            t = {"number": i, "state": "complete" if ok else "fail", "params": {}, "value": value, "feasible": t["feasible"],
                 "reason": t["reason"], "run_dir": str(r), "spend_yuan": t["probe_yuan"]}
        trials.append(t)
    for i, t in enumerate(trials):  # the answer after each trial, as the search records it: the cheapest feasible so far
        so_far = [x.get("projected_yuan", x.get("value")) for x in trials[:i + 1] if x["feasible"]]
        t["best_so_far"] = min(so_far) if so_far else None
    data: dict[str, Any] = {"best": trials[best], "baseline": trials[baseline], "command": "tunekit probe --recipe best.yaml",
                            "trials": trials}
    b, base = trials[best], trials[baseline]
    saving = base.get("projected_yuan", base.get("value")) - b.get("projected_yuan", b.get("value")) if base["feasible"] and b["feasible"] else None
    data |= {"threshold": threshold, "equivalence": []} if legacy else {
        "saving_yuan": saving, "saving_pct": 100 * saving / base["projected_yuan"] if saving is not None else None,
        "study": "s", "reward_threshold": threshold, "reward_window": 10, "stop_reason": "reached 4 trials", "notes": [],
        "learning": {"pairs_compared": 0, "mismatches": [], "z": 3.0, "method": "test"}}
    data |= extra
    (Path(root) / "search.json").write_text(json.dumps(data))
    return Path(root) / "search.json"


def write_study(db: Path, runs: list[Path], threshold: float = 0.5) -> str:
    """An Optuna study over ``runs`` with two knobs, constraints as ``tunekit search`` sets them; returns the storage URL."""
    import optuna

    storage = f"sqlite:///{db}"
    study = optuna.create_study(storage=storage, study_name="s")
    dist = {"system.batch.micro_batch_size": optuna.distributions.CategoricalDistribution([1, 2, 4, 8]),
            "system.memory.gradient_checkpointing": optuna.distributions.CategoricalDistribution([False, True])}
    for i, r in enumerate(runs):
        s = json.loads((r / "summary.json").read_text())
        ok = s["status"] == "ok"
        study.add_trial(optuna.trial.create_trial(
            params={"system.batch.micro_batch_size": (1, 2, 4, 8)[i % 4], "system.memory.gradient_checkpointing": i % 3 == 0},
            distributions=dist, value=s["cost/projected_yuan"] if ok else float("inf"),
            constraints={"reward": threshold - (s.get("reward_last10") or 0) if ok else 1.0},
            user_attrs={"run_dir": str(r), "status": s["status"], "reason": s.get("reason", ""), "probe_yuan": s.get("cost/probe_yuan")}))
    return storage
