"""Recorded studies: a SQLite Optuna study holding what finished probes recorded (reward, its interval, verdict,
projection, spend), and optionally a confirmation round's section, read back by ``build_result`` as a search does.
No probe runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

from tunekit.config import load_recipe
from tunekit.estimate.profiles import load_profile
from tunekit.search.confirm import ATTR as CONFIRM_ATTR, decide
from tunekit.search.result import SearchResult, build_result
from tunekit.search.verdict import Interval, verdict

MICRO = "system.batch.micro_batch_size"
DIST = {MICRO: optuna.distributions.CategoricalDistribution([1, 2, 4, 8, 16])}


def probe(reward: float, low: float, high: float, yuan: float, *, micro: int, baseline: bool = False,
          spend: float = 0.5, status: str = "ok", run_dir: Path | None = None, reference: str | None = None,
          warm_priced: bool = False, machine: str | None = None, learning_of: int | None = None,
          own: float | None = None) -> dict[str, Any]:
    """One finished probe as its trial records it (``reference``: the name of the reference it probed;
    ``warm_priced``: its run priced with its own warm start, :func:`tunekit.estimate.cold_start.warm_priced`;
    ``machine``: the machine it ran on, :func:`tunekit.profiler.machine.machine_id`, unrecorded when None;
    ``learning_of``: the earlier trial whose reward it takes, learning as it did, its own reading ``own``)."""
    return {"reward": reward, "ci": (low, high), "yuan": yuan, "micro": micro, "baseline": baseline, "spend": spend,
            "status": status, "run_dir": str(run_dir) if run_dir else None, "reference": reference,
            "warm_priced": warm_priced, "machine": machine, "learning_of": learning_of, "own": own}


def record(path: Path, probes: list[dict[str, Any]], *, threshold: float, confirmation: dict[str, Any] | None = None,
           spent_confirming: float = 0.0) -> optuna.Study:
    """A SQLite study at ``path`` with one COMPLETE trial per recorded probe (numbered in order)."""
    storage = f"sqlite:///{path}"
    study = optuna.create_study(storage=storage, study_name="recorded")
    for p in probes:
        low, high = p["ci"]
        ok = p["status"] == "ok"
        kind = verdict(Interval(p["reward"], low, high), threshold) if ok else None
        attrs = {"status": p["status"], "reason": "" if ok else "killed", "probe_yuan": p["spend"],
                 "sets": [f"{MICRO}={p['micro']}"], "projected_steps": 100 if ok else None, "run_dir": p["run_dir"]}
        if ok:
            attrs |= {"reward": p["reward"], "reward_ci": [low, high], "verdict": kind, "warm_priced": p["warm_priced"]}
        if p["machine"]:
            attrs["machine"] = p["machine"]
        if p["learning_of"] is not None:
            attrs |= {"learning_of": p["learning_of"], "own_reward": p["own"], "own_reward_ci": [p["own"] - 0.03, p["own"] + 0.03]}
        if p["baseline"]:
            attrs["baseline"] = True
        if p.get("reference"):
            attrs["reference"] = p["reference"]
        study.add_trial(create_trial(state=TrialState.COMPLETE, params={MICRO: p["micro"]}, distributions=DIST,
                                     value=p["yuan"] if ok else math.inf, user_attrs=attrs))
    study.set_user_attr("budget_yuan", 200.0)
    if confirmation is not None:
        study.set_user_attr(CONFIRM_ATTR, confirmation)
    study.set_user_attr("confirmation_spent_yuan", spent_confirming)
    return study


def result_of(study: optuna.Study, out_dir: Path, *, threshold: float, reason: str = "reached 4 trials",
              sets: list[str] = ()) -> SearchResult:
    """What the search writes for ``study`` (its search.json too); ``sets``: the recipe's further overrides."""
    base = load_recipe(None, [f"search.reward_threshold={threshold}", *sets])
    res = build_result(study, base, base.model_dump(mode="json"), load_profile("cpu"), reason, out_dir, None, [])
    out_dir.mkdir(parents=True, exist_ok=True)
    res.write()
    return res


RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded-search"
"""A search of the embedded default as ``tunekit search --budget-yuan 200`` ran it on CPU (its run directories
without logs): 12 trials, 8 pruned on cost, a confirmation round whose answer reaches the threshold within noise.
Its run directories are named relative to the directory above ``search-out/tiny-ppo``."""


def recorded_search(home: Path) -> Path:
    """A copy of :data:`RECORDED` at ``home/search-out/tiny-ppo`` (run from ``home``, its run directories resolve)."""
    out = home / "search-out" / "tiny-ppo"
    shutil.copytree(RECORDED, out)
    return out


def redecide(out: Path) -> SearchResult:
    """The recorded search's result as the search decides it from its study and its probes' run directories: the
    confirmation round decided again from the probes it ran (``tunekit.search.confirm.decide``), then search.json
    written. Run from the directory above ``search-out``."""
    study = optuna.load_study(study_name="tiny-ppo", storage=f"sqlite:///{out / 'study.db'}")
    old, recorded = study.user_attrs[CONFIRM_ATTR], json.loads((out / "search.json").read_text())
    base, profile = load_recipe("tiny-ppo", [f"probe.steps={recorded['probe_steps']}"]), load_profile("cpu")
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    configs = [trials[n] for n in [old["baseline"], *old["candidates"]]]
    study.set_user_attr(CONFIRM_ATTR, decide(base, profile, configs, configs[0], old["probes"], old["cut_short"]))
    res = build_result(study, base, base.model_dump(mode="json"), profile, recorded["stop_reason"], Path("search-out/tiny-ppo"),
                       "tiny-ppo", [])
    res.write()
    return res
