"""The Optuna objective: one trial = one probe of the recipe with the trial's ``--set`` overrides.

- objective: the projected yuan of the full run (``run.*``: its training samples,
  or until the smoothed reward reaches the threshold; ``tunekit.estimate.cost.run_length``),
  from the probe's own records (``tunekit.search.measure``).
- feasibility: ``trial.set_constraint("reward", threshold - mean reward of the last
  search.reward_window steps)``, feasible when <= 0; Optuna 5's TPESampler reads the
  stored constraint itself. The trial's ``verdict`` (feasible / within noise /
  infeasible) reads the reward's interval (``tunekit.search.verdict``).
- learning twins: a trial whose learning keys and seed equal an earlier ok trial's
  differs from it in systems knobs only; when their reward curves agree within
  noise (``tunekit.search.learning``) it inherits that trial's run length and reward
  verdict, so the two are priced on the same learning and differ only in what
  they cost per step. When the curves disagree, its own curve decides and the
  learning check reports the pair.
- a reference (``search.references``: enqueued with its overrides beyond the space's params once it fits the
  time left, ``tunekit.search.references``)
  is never skipped by the cost screen nor pruned on cost: the answer is priced against it.
- a sampled configuration the memory verdict says cannot fit on the card
  (``tunekit.estimate.memory``) is not probed: status ``skipped``, reason ``would not fit: ...``; nor is one the cost model,
  calibrated on the study's own probes, puts far above the bar a probe is pruned against (``tunekit.search.screen``,
  ``search.skip_by_estimate``): reason ``estimated too costly: ...``.
- with ``search.loadtest_screen``, a probe is preceded by a load test of its rollout engine, whose QPS is recorded on
  the trial (``tunekit.search.loadscreen``).
- a probe that ends oom / timeout / failed (or a sampled config that does not
  validate, or one skipped) is a COMPLETE trial with objective ``inf`` and constraint
  ``INFEASIBLE``, its reason a user attr. Not FAIL: TPE ignores FAIL trials, so it
  would keep proposing the crashing region; a completed infeasible trial is ranked
  below every feasible one and pushes the sampler away. FAIL means only "the search
  itself stopped here" and is retried (``tunekit.search.storage``).
- pruning is on cost only: after warm-up plus ``MIN_STEADY_STEPS`` steps, a probe
  whose projection with fixed cost left out (mean steady step time x the fewest steps
  the run can still need, or x the run length of an earlier trial of its learning,
  which it would be read with) is over ``PRUNE_FACTOR`` x the bar
  (``tunekit.search.budget.prune_bar``: the best feasible projection, or that of a
  trial of its learning whose reward reaches the threshold or is within noise of it)
  is stopped and the trial PRUNED.
- under ``--time-limit``, a sampled trial whose runner's probes so far take longer than the time left is not probed:
  it ends FAIL and ``--resume`` probes its configuration first (``tunekit.search.deadline.Deferred``).
- each probe's timeout is capped at what the budget has left, so a slow probe cannot overrun it; a probe that
  runs past its estimate is stopped (status timeout) before it passes what the budget leaves it beside the other
  workers' running probes (``tunekit.search.budget.held``).
- a sampled configuration equal to an earlier trial's reuses that result (no probe, no trial used up); one that
  another worker is probing waits for that probe's result.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from tunekit import metrics
from tunekit.estimate import cold_start, cost, memory
from tunekit.config import Recipe, apply_overrides, validate
from tunekit.config.errors import TunekitError
from tunekit.launch.probe import Plan, check_probe, launch_probe, summarize
from tunekit.estimate.profiles import PriceProfile
from tunekit.rundir import live_rows, new_run_id, write_summary
from tunekit.runners import runner_for
from tunekit.search import confirm, learning, loadscreen, screen, space, storage as studies
from tunekit.search.budget import KILL_GRACE_S, RESERVED_ATTR, RUNNING_ATTR, PruneBar, held, prune_bar, study_spent
from tunekit.search.deadline import Deadline, Deferred, expected_probe_s, scaled_probe_s, warm_wall_s
from tunekit.metrics import MACHINE
from tunekit.search.measure import Reading, learning_key, read_probe, rewards_of, trial_learning_key
from tunekit.search.setup import Setup
from tunekit.search.verdict import Interval, verdict

INFEASIBLE = 1e6
"""Constraint value of a probe that did not finish: larger than any reward shortfall."""
PRUNE_FACTOR = 3.0
"""CPU step times vary by tens of percent between identical probes; 3x leaves room for that."""
MIN_STEADY_STEPS = 3
TWIN_POLL_S = 2.0
"""How often a trial that repeats a configuration another worker is probing looks whether that probe ended."""
BUDGET_CHECK_S = 2.0
"""How often a probe past its hold re-reads the study to see whether the budget still covers it."""

ProgressCb = Callable[[dict[str, Any]], None]


class _CostPrune(Exception):
    def __init__(self, steps: int, projected: float, bar: PruneBar) -> None:
        self.steps, self.projected, self.bar = steps, projected, bar



class Objective:
    def __init__(self, setup: Setup, study: optuna.Study, progress: ProgressCb, deadline: Deadline | None = None) -> None:
        self.s, self.study, self.progress = setup, study, progress
        self.deadline = deadline or Deadline(None)
        """The search's time limit: a sampled trial whose runner does not fit the time left is deferred."""
        self.remaining = setup.budget
        """What the next probe may spend: the budget less the spend so far, other probes' holds and ``keep_back``."""
        self.estimate = setup.first_estimate
        """The next probe's estimated spend, which it holds of the budget while it runs."""
        self.keep_back = 0.0
        """What no probe may spend: the confirmation round's share of the budget and the waiting references' probes."""
        self.admitted: Callable[[], None] = lambda: None
        """Called once the trial is admitted (its configuration and hold recorded): releases the study lock."""
        categorical = all(p.type == "categorical" for p in setup.base.search.space)
        self.space_size = len(space.grid(setup.base.search.space, setup.base_raw)) if categorical else None

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            run = self._admit(trial)
        finally:
            self.admitted()
        return run()

    def _admit(self, trial: optuna.Trial) -> Callable[[], float]:
        """Under the study lock: the trial's configuration, and either the earlier (or running) trial it repeats or
        its hold on the budget; returns what runs once the lock is released."""
        s = self.s
        trial.set_user_attr("worker", studies.worker_id())
        params = space.suggest(trial, s.base.search.space, s.base_raw)
        rest = list(trial.user_attrs.get("reference_sets", []))
        trial.set_user_attr("sets", space.overrides(params) + rest)
        dup = self._duplicate(trial, params, rest)
        if dup is not None:
            return lambda: self._repeat(trial, params, dup)
        return self._prepare(trial, params)

    def _prepare(self, trial: optuna.Trial, params: dict) -> Callable[[], float]:
        s = self.s
        try:
            recipe = validate(apply_overrides(s.base_raw, trial.user_attrs["sets"]), f"{s.source} trial {trial.number}")
            plan = check_probe(recipe, gpu_profile=s.gpu_profile)
        except TunekitError as e:
            message = e.message
            return lambda: self._infeasible(trial, "invalid", message)
        if (why := memory.would_not_fit(plan.recipe, s.profile.memory_gib, traits=runner_for(plan.recipe).traits)):
            return lambda: self._infeasible(trial, "skipped", why)  # no probe: it would only run into OOM
        trials = self.study.get_trials(deepcopy=False)
        reference = bool(trial.user_attrs.get("reference"))  # priced against, so probed whatever it costs
        trial.set_user_attr("runner", plan.recipe.runner)
        if not reference:  # a reference was admitted at its own bound
            self._fits(trial, plan.recipe, trials)
        probed = [t.user_attrs["run_dir"] for t in trials if t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs]
        if not reference and (why := screen.too_costly(plan.recipe, s.profile, probed,
                                                        prune_bar(trials, learning_key(plan.recipe)))):
            return lambda: self._infeasible(trial, "skipped", why)  # no probe: the cost model says it cannot win
        trial.set_user_attr(RESERVED_ATTR, self.estimate)
        return lambda: self._probe(trial, params, plan)

    def _fits(self, trial: optuna.Trial, recipe: Recipe, trials: list[optuna.trial.FrozenTrial]) -> None:
        """Raise :class:`Deferred` when the probes of the trial's runner so far take longer than the time left."""
        expected = expected_probe_s(trials, confirm.recorded(self.study), recipe.probe.timeout_s, runners=[recipe.runner])
        if (scaled := scaled_probe_s(recipe, trials, self.s.profile)) is not None:  # its knobs' step, by the model
            expected = min(max(expected, scaled), recipe.probe.timeout_s + KILL_GRACE_S)
        why = self.deadline.why_not(expected, what=f"trial {trial.number}'s probe ({recipe.runner})")
        if why is not None:
            trial.set_user_attr("status", "deferred")
            trial.set_user_attr("reason", f"deferred to the next part: {why}")
            raise Deferred(why)

    def _repeat(self, trial: optuna.Trial, params: dict, twin: optuna.trial.FrozenTrial) -> float:
        """Reuse the result of the trial with the same configuration, waiting for it if another worker runs it; if that
        worker stopped (its trial FAIL), probe the configuration here."""
        while twin.state == TrialState.RUNNING and not studies.dead_local_worker(twin):
            time.sleep(TWIN_POLL_S)
            with warnings.catch_warnings():  # fail_stale_trials is "experimental" since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)  # a worker on another host that died
            twin = next(t for t in self.study.get_trials(deepcopy=False) if t.number == twin.number)
        if twin.state in (TrialState.COMPLETE, TrialState.PRUNED):
            return self._copy(trial, twin)
        return self._prepare(trial, params)()

    # -- probe ----------------------------------------------------------------

    def _probe(self, trial: optuna.Trial, params: dict, plan: Plan) -> float:
        s, recipe = self.s, plan.recipe
        held = recipe.system.world_size
        cap_s = cost.affordable_s(self.remaining, held, s.profile) - KILL_GRACE_S
        recipe = recipe.model_copy(update={"probe": recipe.probe.model_copy(update={"timeout_s": max(1.0, min(recipe.probe.timeout_s, cap_s))})})
        run_id = f"{new_run_id(recipe.name)}-t{trial.number}"
        self.deadline.started()
        run_dir = (Path(recipe.probe.out) / run_id).resolve()
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("devices", held)
        if recipe.search.loadtest_screen:
            for key, value in loadscreen.signal(recipe).items():
                trial.set_user_attr(key, value)
        self.progress({"event": "trial", "number": trial.number, "params": params, "steps": recipe.probe.steps,
                       "baseline": bool(trial.user_attrs.get("baseline"))})
        guard = _BudgetGuard(self, trial, held)
        bar = None if trial.user_attrs.get("reference") else prune_bar(self.study.get_trials(deepcopy=False),
                                                                         learning_key(recipe))
        watch = _CostWatch(recipe, run_dir, s.profile, bar, self.progress, guard)  # bar None: never pruned on cost
        t0 = time.monotonic()
        try:
            result = launch_probe(dataclasses.replace(plan, recipe=recipe), out=recipe.probe.out, progress=watch,
                                  run_id=run_id)
        except _CostPrune as p:
            return self._pruned(trial, recipe, run_dir, p, time.monotonic() - t0)
        except _BudgetStop as b:
            return self._stopped(trial, recipe, run_dir, b, time.monotonic() - t0)
        except KeyboardInterrupt:  # stopped from outside: what it ran is spent (a probe before its first step leaves
            # no run directory to time it by), and the trial is probed again on --resume
            trial.set_user_attr("probe_yuan", cost.probe_spend(time.monotonic() - t0, held, s.profile).yuan)
            raise
        except TunekitError as e:
            return self._infeasible(trial, "invalid", e.message)
        summ = result.summary
        trial.set_user_attr("probe_yuan", float(summ.get("cost/probe_yuan", 0.0)))
        trial.set_user_attr("wall_s", float(summ["wall_s"]))
        trial.set_user_attr("warm_wall_s", warm_wall_s(summ))
        trial.set_user_attr("warm_priced", cold_start.warm_priced(summ))
        trial.set_user_attr("machine", summ.get(MACHINE))
        if result.status != "ok" or not summ.get("steps"):
            reason = summ.get("reason") or "no steps recorded"
            if result.status == "timeout" and cap_s < recipe.probe.timeout_s + 1:
                reason += f" (timeout capped at {cap_s:.0f} s by the remaining budget)"
            return self._infeasible(trial, result.status, reason)
        return self._priced(trial, recipe, run_dir, summ)

    def _priced(self, trial: optuna.Trial, recipe: Recipe, run_dir: Path, summ: dict[str, Any]) -> float:
        """An ok probe: its reward verdict, the full run's length (its own or its learning twin's) and price."""
        s, key = self.s.base.search, learning_key(recipe)
        reading = read_probe(recipe, run_dir, summ, self.s.profile)
        reward, twin = reading.reward, self._twin(key, reading)
        if twin is not None:
            ua = twin.user_attrs
            inherited = cost.RunLength(ua.get("projected_steps"), f"trial {twin.number}'s, same learning: {ua['run_rule']}")
            reading = read_probe(recipe, run_dir, summ, self.s.profile, length=inherited)
            reward = Interval(ua["reward"], *ua["reward_ci"])
            trial.set_user_attr("learning_of", twin.number)
            trial.set_user_attr("own_reward", reading.reward.value)
            trial.set_user_attr("own_reward_ci", [reading.reward.low, reading.reward.high])
        kind = verdict(reward, s.reward_threshold) if reading.length.steps is not None else "infeasible"
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("learning_key", key)
        trial.set_user_attr("reward", reward.value)
        trial.set_user_attr("reward_ci", [reward.low, reward.high])
        trial.set_user_attr("verdict", kind)
        trial.set_user_attr("projected_steps", reading.length.steps)
        trial.set_user_attr("run_rule", reading.length.rule)
        shortfall = s.reward_threshold - reward.value
        trial.set_constraint("reward", shortfall if reading.length.steps is not None else max(shortfall, 1e-9))
        return reading.yuan if reading.yuan is not None else math.inf

    def _twin(self, key: str, reading: Reading) -> optuna.trial.FrozenTrial | None:
        """The first earlier ok trial with the same learning keys whose reward curve agrees with this one's."""
        window = self.s.base.search.reward_window
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            ua = t.user_attrs
            if "learning_of" in ua or "duplicate_of" in ua or ua.get("status") != "ok" or trial_learning_key(ua) != key:
                continue
            theirs = rewards_of(ua.get("run_dir"))
            if min(len(theirs), len(reading.rewards)) < 2:
                continue
            c = learning.compare(theirs, reading.rewards, window)
            if c["last_diff"] <= c["last_bound"] and c["curve_diff"] <= c["curve_bound"]:
                return t
        return None

    def _pruned(self, trial: optuna.Trial, recipe: Recipe, run_dir: Path, p: _CostPrune, wall_s: float) -> float:
        reason = (f"pruned on cost: projected >= {p.projected:.4g} yuan after {p.steps} steps, over {PRUNE_FACTOR:g}x "
                  f"{p.bar.says()}")
        summ = summarize(recipe, run_dir, "pruned", reason, wall_s, self.s.profile)
        write_summary(run_dir, summ)
        trial.set_user_attr("probe_yuan", float(summ.get("cost/probe_yuan", 0.0)))
        trial.set_user_attr("wall_s", wall_s)
        trial.set_user_attr("status", "pruned")
        trial.set_user_attr("reason", reason)
        trial.report(p.projected, p.steps)
        raise optuna.TrialPruned(reason)

    def _stopped(self, trial: optuna.Trial, recipe: Recipe, run_dir: Path, b: _BudgetStop, wall_s: float) -> float:
        reason = (f"stopped by the budget after {wall_s:.0f} s: its spend ({b.spent:.4g} yuan) was about to pass what the "
                  f"budget leaves it beside the other running probes ({b.left:.4g} yuan)")
        held = recipe.system.world_size
        summ = {"cost/probe_yuan": cost.probe_spend(wall_s, held, self.s.profile).yuan}
        if run_dir.is_dir():  # the launcher removes a run dir that recorded no step
            summ = summarize(recipe, run_dir, "timeout", reason, wall_s, self.s.profile)
            write_summary(run_dir, summ)
        trial.set_user_attr("probe_yuan", float(summ.get("cost/probe_yuan", 0.0)))
        trial.set_user_attr("wall_s", wall_s)
        return self._infeasible(trial, "timeout", reason)

    def _infeasible(self, trial: optuna.Trial, status: str, reason: str) -> float:
        trial.set_user_attr("status", status)
        trial.set_user_attr("reason", reason[:500])
        trial.set_constraint("reward", INFEASIBLE)
        return math.inf

    # -- duplicates -------------------------------------------------------------

    def _duplicate(self, trial: optuna.Trial, params: dict, rest: list[str]) -> optuna.trial.FrozenTrial | None:
        """The earlier trial that probed (or is probing, in any worker) this configuration: the same params and the
        same overrides beyond them (a reference's, ``rest``)."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
            probes = "duplicate_of" not in t.user_attrs if t.state != TrialState.RUNNING else RESERVED_ATTR in t.user_attrs
            same = t.params == params and sorted(t.user_attrs.get("reference_sets", [])) == sorted(rest)
            if t.number != trial.number and same and probes:
                return t
        return None

    def _copy(self, trial: optuna.Trial, orig: optuna.trial.FrozenTrial) -> float:
        trial.set_user_attr("duplicate_of", orig.number)
        for k in ("status", "reason", "reward", "reward_ci", "verdict", "projected_steps", "run_rule", "learning_of", "run_dir"):
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


class _BudgetStop(Exception):
    def __init__(self, spent: float, left: float) -> None:
        self.spent, self.left = spent, left


class _BudgetGuard:
    """While a probe runs: once its spend passes its estimate, publish the spend (other workers' budget checks read it)
    and stop the probe before it passes what the budget leaves it beside the other running probes' holds
    (:func:`tunekit.search.budget.held`)."""

    def __init__(self, objective: Objective, trial: optuna.Trial, devices: int) -> None:
        self.o, self.trial, self.devices = objective, trial, devices
        self.hold = float(trial.user_attrs.get(RESERVED_ATTR, objective.estimate))
        self.t0 = self.last = time.monotonic()

    def __call__(self) -> None:
        now, o = time.monotonic(), self.o
        if now - self.last < BUDGET_CHECK_S:
            return
        self.last = now
        spend = cost.probe_spend(now - self.t0, self.devices, o.s.profile).yuan
        if spend <= self.hold:
            return
        self.trial.set_user_attr(RUNNING_ATTR, spend)
        others = held(o.study.get_trials(deepcopy=False), by=self.trial.number)
        left = o.s.budget - study_spent(o.study, o.s.profile) - others - o.keep_back
        # stop now if it could pass what is left before the next check and the kill
        if spend + cost.probe_spend(BUDGET_CHECK_S + KILL_GRACE_S, self.devices, o.s.profile).yuan > left:
            raise _BudgetStop(spend, left)


class _CostWatch:
    """The probe's progress callback: reports steps, stops a probe that can't win on cost, and runs the budget guard."""

    def __init__(self, recipe: Recipe, run_dir: Path, profile: PriceProfile, bar: PruneBar | None, progress: ProgressCb,
                 guard: Callable[[], None] = lambda: None) -> None:
        self.recipe, self.run_dir, self.profile, self.bar, self.progress = recipe, run_dir, profile, bar, progress
        self.guard = guard
        self.seen = -1

    def __call__(self, n: int) -> None:
        self.guard()
        if n == self.seen:
            return
        self.seen = n
        self.progress({"event": "step", "n": n, "total": self.recipe.probe.steps})
        warm = self.recipe.probe.warmup_steps
        if self.bar is None or n < warm + MIN_STEADY_STEPS or n >= self.recipe.probe.steps:
            return
        rows = [r for r in live_rows(self.run_dir) if metrics.TIMING_STEP in r and metrics.REWARD_MEAN in r]
        curve = metrics.reward_curve(pd.DataFrame(rows), self.recipe.search.reward_metric)
        times = [r[metrics.TIMING_STEP] for r in rows[warm:]]
        if len(times) < MIN_STEADY_STEPS:
            return
        r = self.recipe
        length = cost.recipe_run_length(r, curve)
        # not reached yet: more steps than so far, and its learning's run length where an earlier trial measured it
        fewest = length.steps if length.steps is not None else max(len(rows) + 1, self.bar.steps or 0)
        low = cost.project_run(startup_s=0.0, step_times_s=times, warmup_steps=0, target_steps=fewest,
                               gpus_held=r.system.world_size, profile=self.profile).yuan
        if low > PRUNE_FACTOR * self.bar.yuan:
            raise _CostPrune(n, low, self.bar)
