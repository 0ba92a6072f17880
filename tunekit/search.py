"""Optuna search for the cheapest configuration whose reward still reaches the threshold.

One trial = one probe (``run_probe``, its own process tree) of the recipe with the
trial's ``--set`` overrides and ``search.probe_steps`` steps.

- objective: the probe's ``cost/projected_yuan`` (minimise).
- feasibility: ``trial.set_constraint("reward", threshold - mean reward of the last
  search.reward_window steps)``, feasible when <= 0. Optuna 5 deprecates the
  sampler's ``constraints_func`` in favour of this; its TPESampler reads the stored
  constraint itself, so infeasible trials steer the sampler away.
- a probe that ends oom / timeout / failed (or a sampled config that does not
  validate) is a COMPLETE trial with objective ``inf`` and constraint
  ``INFEASIBLE``, its reason a user attr. Not FAIL: TPE ignores FAIL trials, so it
  would keep proposing the crashing region; a completed infeasible trial is ranked
  below every feasible one and pushes the sampler away. FAIL means only "the search
  itself stopped here" and is retried (``tunekit.study``).
- pruning is on cost only: after warm-up plus ``MIN_STEADY_STEPS`` steps, a probe
  whose lower-bound projection (target steps x median steady step time, startup
  left out) is over ``PRUNE_FACTOR`` x the best feasible projection is stopped and
  the trial PRUNED with that projection as its intermediate value.
- budget: before each probe the next spend is estimated (median of the probes so
  far; for the first, the recipe's timeout on its devices, an upper bound) and the
  search stops if spent + estimate (+ probes running in other workers) would pass
  the budget. Each probe's timeout is also capped at what the budget has left, so
  a slow probe cannot overrun it. Spend lives in the trials' user attrs, so
  ``--resume`` and other workers see it.
- a sampled configuration equal to an earlier trial's reuses that result (no probe).
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import TrialState

from tunekit import cost, space, study as studies
from tunekit.config import Recipe, apply_overrides, validate
from tunekit.errors import ConfigError, TunekitError
from tunekit.preflight import preflight, uses_cuda
from tunekit.probe import pick_profile, run_probe, summarize
from tunekit.profiles import PriceProfile
from tunekit.records import new_run_id, read_steps, write_json
from tunekit.search_result import SearchResult, build_result

INFEASIBLE = 1e6
"""Constraint value of a probe that did not finish: larger than any reward shortfall."""
PRUNE_FACTOR = 3.0
"""CPU step-time medians vary by tens of percent between identical probes; 3x leaves room for that."""
MIN_STEADY_STEPS = 3
KILL_GRACE_S = 5.0
"""Time the launcher may take to end a probe's tree after its timeout."""

ProgressCb = Callable[[dict[str, Any]], None]


class _CostPrune(Exception):
    def __init__(self, steps: int, projected: float) -> None:
        self.steps, self.projected = steps, projected


@dataclass
class _Setup:
    base_raw: dict
    base: Recipe
    profile: PriceProfile
    source: str
    budget: float
    first_estimate: float
    gpu_profile: str | None


def _probe_raw(recipe: Recipe, out_dir: Path) -> dict:
    raw = recipe.model_dump(mode="json")
    if recipe.search.probe_steps:
        raw["probe"]["steps"] = recipe.search.probe_steps
    raw["probe"]["out"] = str(out_dir / "runs")
    return raw


def _price_per_device_s(profile: PriceProfile) -> float:
    return profile.yuan_per_gpu_hour / cost.SECONDS_PER_HOUR


def _probed(trials: list[optuna.trial.FrozenTrial]) -> list[float]:
    return [t.user_attrs["probe_yuan"] for t in trials if t.user_attrs.get("probe_yuan", 0) > 0]


def estimate_next(trials: list[optuna.trial.FrozenTrial], first: float) -> float:
    """Median spend of the probes so far, else the first probe's conservative estimate."""
    spends = _probed(trials)
    return statistics.median(spends) if spends else first


def spent(trials: list[optuna.trial.FrozenTrial], profile: PriceProfile) -> float:
    return sum(studies.spend_of(t, _price_per_device_s(profile)) for t in trials)


def best_feasible(trials: list[optuna.trial.FrozenTrial]) -> float | None:
    vals = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
            and all(v <= 0 for v in t.constraints.values())]
    return min(vals) if vals else None


def _setup(recipe: Recipe, budget_yuan: float, trials: int, out_dir: Path, gpu_profile: str | None, source: str) -> _Setup:
    if not budget_yuan > 0:
        raise ConfigError(f"--budget-yuan {budget_yuan:g}: the probe budget must be > 0 yuan, e.g. --budget-yuan 200.")
    if trials < 1:
        raise ConfigError(f"--trials {trials}: a search needs at least 1 trial.")
    space.check_space(recipe, source)
    raw = _probe_raw(recipe, out_dir)
    base = validate(raw, source)
    cuda = torch.cuda.device_count()
    preflight(base, cuda)
    profile = pick_profile(gpu_profile, uses_cuda(base, cuda))
    if profile is None:
        raise ConfigError("this GPU matches no price profile, so probe spend can't be priced; pass --gpu-profile NAME (see `tunekit profiles`).")
    space.baseline_params(recipe.search.space, raw, source)
    first = (base.probe.timeout_s + KILL_GRACE_S) * base.system.world_size * _price_per_device_s(profile)
    return _Setup(raw, base, profile, source, budget_yuan, first, gpu_profile)


def _open_study(setup: _Setup, storage: str | None, name: str, resume: bool, out_dir: Path, seed: int | None,
                n_trials: int) -> optuna.Study:
    """Every check before anything is created; then the study (the baseline enqueued first when new)."""
    url = storage or studies.default_storage(out_dir)
    sqlite_file = url.startswith("sqlite:///") and Path(url.removeprefix("sqlite:///")).exists()
    st = studies.open_storage(url, must_exist=resume) if (resume or storage or sqlite_file) else None
    exists = st is not None and studies.study_exists(st, name)
    if resume and not exists:
        raise ConfigError(f"--resume: no study named {name!r} in {studies.redact(url)}; run without --resume to start it (or pass --study NAME).")
    if not resume and exists:
        raise ConfigError(f"a study named {name!r} already exists in {studies.redact(url)}; pass --resume to continue it or --study NEW_NAME.")
    if exists:
        old = optuna.load_study(study_name=name, storage=st).get_trials(deepcopy=False)
        left = setup.budget - spent(old, setup.profile)
        est = estimate_next(old, setup.first_estimate)
        if left < est:
            raise ConfigError(f"--budget-yuan {setup.budget:g}: the study has spent {setup.budget - left:.4g} yuan and the next probe is "
                              f"estimated at {est:.4g} yuan; raise the budget to continue.")
    elif setup.budget < setup.first_estimate:
        raise ConfigError(f"--budget-yuan {setup.budget:g} is below one probe's estimated cost of {setup.first_estimate:.4g} yuan "
                          f"({setup.base.probe.timeout_s:g} s timeout x {setup.base.system.world_size} device(s) at "
                          f"{setup.profile.yuan_per_gpu_hour:g} yuan/h, profile {setup.profile.name}); raise the budget or lower probe.timeout_s.")
    out_dir.mkdir(parents=True, exist_ok=True)
    st = st or studies.open_storage(url, must_exist=False)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(3, n_trials // 3)), multivariate=True,
                                         group=True, constant_liar=True)
    study = optuna.create_study(storage=st, study_name=name, direction="minimize", sampler=sampler, load_if_exists=resume)
    if not exists:
        study.set_user_attr("recipe", setup.base.name)
        study.set_user_attr("probe_steps", setup.base.probe.steps)
        study.enqueue_trial(space.baseline_params(setup.base.search.space, setup.base_raw, setup.source), user_attrs={"baseline": True})
    study.set_user_attr("budget_yuan", setup.budget)
    return study


class _Objective:
    def __init__(self, setup: _Setup, study: optuna.Study, progress: ProgressCb) -> None:
        self.s, self.study, self.progress = setup, study, progress
        self.remaining = setup.budget
        categorical = all(p.type == "categorical" for p in setup.base.search.space)
        self.space_size = len(space.grid(setup.base.search.space, setup.base_raw)) if categorical else None

    def __call__(self, trial: optuna.Trial) -> float:
        s = self.s
        trial.set_user_attr("worker", studies.worker_id())
        params = space.suggest(trial, s.base.search.space, s.base_raw)
        trial.set_user_attr("sets", space.overrides(params))
        dup = self._duplicate(trial, params)
        if dup is not None:
            return self._copy(trial, dup)
        try:
            recipe = validate(apply_overrides(s.base_raw, space.overrides(params)), f"{s.source} trial {trial.number}")
            preflight(recipe, torch.cuda.device_count())
        except TunekitError as e:
            return self._infeasible(trial, "invalid", e.message)
        return self._probe(trial, params, recipe)

    # -- probe ----------------------------------------------------------------

    def _probe(self, trial: optuna.Trial, params: dict, recipe: Recipe) -> float:
        s, held = self.s, recipe.system.world_size
        cap_s = self.remaining / (held * _price_per_device_s(s.profile)) - KILL_GRACE_S
        recipe = recipe.model_copy(update={"probe": recipe.probe.model_copy(update={"timeout_s": max(1.0, min(recipe.probe.timeout_s, cap_s))})})
        run_id = f"{new_run_id(recipe.name)}-t{trial.number}"
        run_dir = (Path(recipe.probe.out) / run_id).resolve()
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("devices", held)
        self.progress({"event": "trial", "number": trial.number, "params": params, "steps": recipe.probe.steps,
                       "baseline": bool(trial.user_attrs.get("baseline"))})
        watch = _CostWatch(recipe, run_dir, s.profile, best_feasible(self.study.get_trials(deepcopy=False)), self.progress)
        t0 = time.monotonic()
        try:
            result = run_probe(recipe, out=recipe.probe.out, gpu_profile=s.gpu_profile,
                               progress=watch, run_id=run_id)
        except _CostPrune as p:
            return self._pruned(trial, recipe, run_dir, p, time.monotonic() - t0)
        except TunekitError as e:
            return self._infeasible(trial, "invalid", e.message)
        summ = result.summary
        trial.set_user_attr("probe_yuan", float(summ.get("cost/probe_yuan", 0.0)))
        trial.set_user_attr("wall_s", float(summ["wall_s"]))
        if result.status != "ok" or "cost/projected_yuan" not in summ:
            reason = summ.get("reason") or "no steps recorded"
            if result.status == "timeout" and cap_s < recipe.probe.timeout_s + 1:
                reason += f" (timeout capped at {cap_s:.0f} s by the remaining budget)"
            return self._infeasible(trial, result.status, reason)
        rewards = read_steps(run_dir)["reward/mean"].tolist()
        window = rewards[-s.base.search.reward_window:]
        reward = sum(window) / len(window)
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("reward", reward)
        trial.set_user_attr("reward_last10", summ.get("reward_last10"))
        trial.set_constraint("reward", s.base.search.reward_threshold - reward)
        return float(summ["cost/projected_yuan"])

    def _pruned(self, trial: optuna.Trial, recipe: Recipe, run_dir: Path, p: _CostPrune, wall_s: float) -> float:
        reason = f"pruned on cost: projected >= {p.projected:.4g} yuan after {p.steps} steps, over {PRUNE_FACTOR:g}x the best feasible"
        summ = summarize(recipe, run_dir, "pruned", reason, wall_s, self.s.profile)
        write_json(run_dir / "summary.json", summ)
        trial.set_user_attr("probe_yuan", float(summ.get("cost/probe_yuan", 0.0)))
        trial.set_user_attr("wall_s", wall_s)
        trial.set_user_attr("status", "pruned")
        trial.set_user_attr("reason", reason)
        trial.report(p.projected, p.steps)
        raise optuna.TrialPruned(reason)

    def _infeasible(self, trial: optuna.Trial, status: str, reason: str) -> float:
        trial.set_user_attr("status", status)
        trial.set_user_attr("reason", reason[:500])
        trial.set_constraint("reward", INFEASIBLE)
        return math.inf

    # -- duplicates -------------------------------------------------------------

    def _duplicate(self, trial: optuna.Trial, params: dict) -> optuna.trial.FrozenTrial | None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.params == params and "duplicate_of" not in t.user_attrs:
                return t
        return None

    def _copy(self, trial: optuna.Trial, orig: optuna.trial.FrozenTrial) -> float:
        trial.set_user_attr("duplicate_of", orig.number)
        for k in ("status", "reason", "reward", "reward_last10", "run_dir"):
            if k in orig.user_attrs:
                trial.set_user_attr(k, orig.user_attrs[k])
        self.progress({"event": "duplicate", "number": trial.number, "of": orig.number})
        if orig.state == TrialState.PRUNED:
            step, value = max(orig.intermediate_values.items())
            trial.report(value, step)
            raise optuna.TrialPruned(f"same configuration as pruned trial {orig.number}")
        for k, v in orig.constraints.items():
            trial.set_constraint(k, v)
        return orig.value


class _CostWatch:
    """The probe's progress callback: reports steps and stops a probe that can't win on cost."""

    def __init__(self, recipe: Recipe, run_dir: Path, profile: PriceProfile, best: float | None, progress: ProgressCb) -> None:
        self.recipe, self.run_dir, self.profile, self.best, self.progress = recipe, run_dir, profile, best, progress
        self.seen = -1

    def __call__(self, n: int) -> None:
        if n == self.seen:
            return
        self.seen = n
        self.progress({"event": "step", "n": n, "total": self.recipe.probe.steps})
        warm = self.recipe.probe.warmup_steps
        if self.best is None or n < warm + MIN_STEADY_STEPS or n >= self.recipe.probe.steps:
            return
        times = _step_times(self.run_dir)[warm:]
        if len(times) < MIN_STEADY_STEPS:
            return
        held = self.recipe.system.world_size
        low = self.recipe.probe.target_steps * statistics.median(times) * held * _price_per_device_s(self.profile)
        if low > PRUNE_FACTOR * self.best:
            raise _CostPrune(n, low)


def _step_times(run_dir: Path) -> list[float]:
    p = run_dir / "steps.jsonl"
    if not p.exists():
        return []
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip().endswith("}")]
    return [r["timing_s/step"] for r in rows if "timing_s/step" in r]


def run_search(recipe: Recipe, *, budget_yuan: float, trials: int = 12, storage: str | None = None, resume: bool = False,
               out_dir: str | Path = "search-out", gpu_profile: str | None = None, progress_cb: ProgressCb | None = None,
               study_name: str | None = None, recipe_ref: str | None = None, base_overrides: list[str] | None = None,
               seed: int | None = None, source: str | None = None) -> SearchResult:
    """Run (or resume) the study until ``trials`` trials are done or the next probe would pass the budget.

    Bad input raises ConfigError before the output directory or the study is created or changed.
    ``recipe_ref``/``base_overrides`` only shape the printed ``tunekit probe`` command of the best configuration.
    """
    out_dir = Path(out_dir)
    progress = progress_cb or (lambda _e: None)
    name = study_name or recipe.name
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trial outcomes are reported by progress_cb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        setup = _setup(recipe, budget_yuan, trials, out_dir, gpu_profile, source or f"recipe {recipe.name}")
        study = _open_study(setup, storage, name, resume, out_dir, seed, trials)
        retried = studies.recover(study)
        objective = _Objective(setup, study, progress)
        progress({"event": "start", "study": name, "budget": budget_yuan, "trials": trials, "retried": retried})
        reason = _loop(study, objective, setup, trials, out_dir, progress, recipe_ref, base_overrides or [])
    return _finish(study, setup, reason, out_dir, recipe_ref, base_overrides or [], progress)


def _distinct(trials: list[optuna.trial.FrozenTrial]) -> int:
    done = [t.params for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return len({json.dumps(p, sort_keys=True) for p in done})


def _loop(study: optuna.Study, objective: _Objective, setup: _Setup, n_trials: int, out_dir: Path, progress: ProgressCb,
          ref: str | None, sets: list[str]) -> str:
    while True:
        all_trials = study.get_trials(deepcopy=False)
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in all_trials)
        if done >= n_trials:
            return f"reached {n_trials} trials"
        if objective.space_size is not None and _distinct(all_trials) >= objective.space_size:
            return f"tried all {objective.space_size} configurations of the space"
        used = spent(all_trials, setup.profile)
        est = estimate_next(all_trials, setup.first_estimate)
        others = sum(t.state == TrialState.RUNNING for t in all_trials) * est
        objective.remaining = setup.budget - used - others
        progress({"event": "budget", "spent": used, "estimate": est, "budget": setup.budget, "done": done,
                  "best": best_feasible(all_trials)})
        if used + others + est > setup.budget:
            return (f"budget: spent {used:.4g} of {setup.budget:g} yuan; the next probe (estimated {est:.4g} yuan"
                    + (f", plus {others:.4g} for probes running elsewhere" if others else "") + ") would pass it")
        finished: list[optuna.trial.FrozenTrial] = []
        try:
            study.optimize(objective, n_trials=1, catch=(), callbacks=[lambda _s, t: finished.append(t)])
        except KeyboardInterrupt:
            return "interrupted (Ctrl-C); the running trial is FAIL and is retried on --resume"
        build_result(study, setup.base, setup.base_raw, setup.profile, "running", out_dir, ref, sets).write()
        all_trials = study.get_trials(deepcopy=False)
        progress({"event": "done", "trial": finished[-1] if finished else None, "spent": spent(all_trials, setup.profile),
                  "best": best_feasible(all_trials), "budget": setup.budget})


def _finish(study: optuna.Study, setup: _Setup, reason: str, out_dir: Path, ref: str | None, sets: list[str],
            progress: ProgressCb) -> SearchResult:
    result = build_result(study, setup.base, setup.base_raw, setup.profile, reason, out_dir, ref, sets)
    study.set_user_attr("spent_yuan", result.spent_yuan)
    result.write()
    progress({"event": "stop", "reason": reason})
    return result
