"""What a search found, read back from its study: per-trial rows, the best feasible trial, the saving
against the baseline, the command that runs it, and the systems-knob learning check.

``out_dir/search.json`` holds all of it (rewritten after every trial, so a killed
search still leaves its evidence).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunekit.search import learning, space
from tunekit.config import Recipe
from tunekit.profiles import PriceProfile
from tunekit.records import read_steps, write_json
from tunekit.search.storage import spend_of


@dataclass
class SearchResult:
    study: str
    storage: str
    out_dir: str
    recipe: str
    profile: str
    budget_yuan: float
    spent_yuan: float
    stop_reason: str
    reward_threshold: float
    reward_window: int
    probe_steps: int
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    baseline: dict[str, Any] | None
    saving_yuan: float | None
    saving_pct: float | None
    command: str | None
    learning: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def json_path(self) -> Path:
        return Path(self.out_dir) / "search.json"

    def write(self) -> None:
        write_json(self.json_path, asdict(self))


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _row(t: optuna.trial.FrozenTrial, profile: PriceProfile) -> dict[str, Any]:
    ua = t.user_attrs
    feasible = t.state == TrialState.COMPLETE and bool(t.constraints) and all(v <= 0 for v in t.constraints.values())
    return {
        "number": t.number, "state": t.state.name, "baseline": bool(ua.get("baseline")), "params": dict(t.params),
        "sets": ua.get("sets", []), "status": ua.get("status", "running" if t.state == TrialState.RUNNING else t.state.name.lower()),
        "reason": ua.get("reason", ""), "projected_yuan": _finite(t.value) if t.state == TrialState.COMPLETE else None,
        "reward": ua.get("reward"), "feasible": feasible, "probe_yuan": spend_of(t, profile), "wall_s": ua.get("wall_s"),
        "run_dir": ua.get("run_dir"), "duplicate_of": ua.get("duplicate_of"), "retry_of": ua.get("retry_of"),
        "worker": ua.get("worker"),
    }


def probe_command(ref: str | None, sets: list[str], steps: int) -> str:
    recipe = f" --recipe {ref}" if ref else ""
    return f"tunekit probe{recipe} --steps {steps} {space.shell_sets(sets)}".rstrip()


def _effective(row: Mapping[str, Any], keys: list[str], base_raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every space key's value in this trial: sampled, or else the recipe's own."""
    return {k: row["params"].get(k, space.encode(space.lookup(base_raw, k))) for k in keys}


def _curve(run_dir: str | None) -> list[float]:
    if not run_dir or not Path(run_dir).is_dir():
        return []
    steps = read_steps(Path(run_dir))
    return steps["reward/mean"].tolist() if "reward/mean" in steps else []


def learning_check(rows: list[dict[str, Any]], base: Recipe, base_raw: Mapping[str, Any]) -> dict[str, Any]:
    keys = [p.key for p in base.search.space]
    # every finished probe, feasible or not: a systems knob that makes learning fail is the case to catch
    ok = [r for r in rows if r["duplicate_of"] is None and r["status"] == "ok"]
    compared, found = learning.check_pairs([(r["number"], _effective(r, keys, base_raw), _curve(r["run_dir"])) for r in ok],
                                           base.search.reward_window)
    return {"pairs_compared": compared, "mismatches": [m.as_dict() for m in found], "z": learning.Z, "scope": "probes that ended ok",
            "method": "last-window and whole-curve mean reward; bound = Z x combined standard error of the per-step means"}


def build_result(study: optuna.Study, base: Recipe, base_raw: Mapping[str, Any], profile: PriceProfile, reason: str,
                 out_dir: Path, ref: str | None, sets: list[str]) -> SearchResult:
    rows = [_row(t, profile) for t in study.get_trials(deepcopy=False)]
    feasible = [r for r in rows if r["feasible"] and r["projected_yuan"] is not None]
    best = min(feasible, key=lambda r: r["projected_yuan"]) if feasible else None
    baselines = [r for r in rows if r["baseline"] and r["state"] == "COMPLETE"]
    baseline = baselines[-1] if baselines else None
    notes, saving, pct = [], None, None
    if best is None:
        notes.append(f"no trial reached the reward threshold {base.search.reward_threshold} "
                     f"(mean of the last {base.search.reward_window} steps); lower it or widen the space.")
    if baseline is not None and best is not None:
        if baseline["feasible"]:
            saving = baseline["projected_yuan"] - best["projected_yuan"]
            pct = 100.0 * saving / baseline["projected_yuan"] if baseline["projected_yuan"] else None
        else:
            notes.append(f"the baseline (trial {baseline['number']}) did not reach the threshold ({baseline['status']}); "
                         "there is no saving to report against it.")
    check = learning_check(rows, base, base_raw)
    notes += [m["sentence"] for m in check["mismatches"]]
    storage = study._storage
    url = getattr(storage, "url", "") if not hasattr(storage, "engine") else str(storage.engine.url.render_as_string(hide_password=True))
    return SearchResult(
        study=study.study_name, storage=url, out_dir=str(out_dir), recipe=base.name, profile=profile.name,
        budget_yuan=float(study.user_attrs.get("budget_yuan", 0.0)), spent_yuan=sum(r["probe_yuan"] for r in rows),
        stop_reason=reason, reward_threshold=base.search.reward_threshold, reward_window=base.search.reward_window,
        probe_steps=base.probe.steps, trials=rows, best=best, baseline=baseline, saving_yuan=saving, saving_pct=pct,
        command=probe_command(ref, sets + best["sets"], base.probe.steps) if best else None, learning=check, notes=notes,
    )
