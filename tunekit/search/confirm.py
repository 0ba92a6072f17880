"""The confirmation round: before the search answers, its top candidates and the baseline run again.

When the trials stop (budget, trial count or space exhausted), the cheapest
``search.confirm_top`` trials whose verdict is feasible or within noise are probed
again with the baseline and the references (``search.references``; not with ``search.confirm_references`` false: the
answer then quotes each reference's saving from single probes), once per fresh seed (``search.confirm_seeds``; seeds the
search did not use), alternating in one run: round r runs every configuration once,
starting one further along each round, so each pair sees the same machine. A round resumed on another machine
(``--resume`` after a time limit) pairs only probes that ran on one machine (:data:`~tunekit.metrics.MACHINE`):
once a seed's probes have run, where one of them ran on this machine, the configurations that seed probed on other
machines only are probed again here (partner probes, ``partners``; each as the time left allows), so a reference
probed in a part of its own still pairs with the baseline and the candidates. The section lists the rounds that ran
on more than one machine (``split_rounds``). The answer is decided by

- cost: paired ratios of projected GPU-seconds, candidate over baseline and between
  the top two, per round, combined with their interval, and told apart only beyond how
  far the paired ratios move from round to round (``tunekit.search.verdict.compare``);
  step-time ratios alongside;
- reward: over all seeds (the trial's own probe and the round's), its interval and verdict;
- run length: with ``run.until: threshold``, the step at which the seeds' averaged
  reward curve, smoothed, first reaches the threshold (never: infeasible);
- projected full-run cost: each configuration's round probes at that run length,
  combined like the ratios (geometric mean over rounds), so the costs the answer
  quotes and the paired ratios come from the same probes. The trials' own probes
  ran at other times, on a machine loaded otherwise; their projections are not
  compared with the round's.

The search keeps ``(confirm_top + 1 + references) x confirm_seeds`` probes' worth of budget back (the references
counted only where the round runs them)
for it (at the median probe spend so far; a reference not probed yet counted in; partner probes are not kept back
for); a round the budget cannot pay is cut short and the answer says it is unconfirmed.

Every finished probe of the round is kept in the study (``ATTR``) as it ends; a round stopped part-way (the search's
time limit, a signal) is continued by ``--resume`` without probing again a configuration and seed it has. Under a time
limit, a probe that does not fit the time left waits for a later part while the round's probes that fit run (a
reference at another trainer's defaults may take a part of its own); the round is decided once it has them all.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunekit.estimate import cost
from tunekit.config import Recipe, SearchConfig, apply_overrides, validate
from tunekit.config.errors import TunekitError
from tunekit.launch.probe import run_probe
from tunekit.metrics import MACHINE
from tunekit.profiler.machine import machine_id
from tunekit.rundir import new_run_id, read_summary
from tunekit.search import storage as studies
from tunekit.search.budget import CONFIRMED_ATTR, KILL_GRACE_S, grace_yuan
from tunekit.search.deadline import INTERRUPTED, Deadline, expected_probe_s, warm_wall_s
from tunekit.search.measure import read_probe, reward_of
from tunekit.search.setup import Setup
from tunekit.search.verdict import (
    Measured,
    Spread,
    compare,
    paired_ratio,
    round_spread,
    verdict,
)

Unit = tuple[int, "str | None"]
"""What a round pairs probes within: its round and the machine it ran on (:data:`~tunekit.metrics.MACHINE`,
None where the probe recorded none)."""
ATTR = "confirmation"
"""Study user attr holding the round's section of search.json (rewritten after every probe)."""
SKIPPED_ATTR = "confirmation_skipped"
"""Study user attr holding why the round probed nothing (None when it ran)."""


def probes_needed(search: SearchConfig, trials: list[optuna.trial.FrozenTrial], *, waiting: int = 0) -> int:
    """Probes the confirmation round runs: ``search.confirm_top`` candidates, the baseline and the references that
    ended ok among ``trials`` (and the ``waiting`` references not probed yet, should theirs end ok; none with
    ``search.confirm_references`` false), once per ``search.confirm_seeds`` seed (none with ``confirm_top`` 0)."""
    top = search.confirm_top
    refs = len(round_references(trials, search)) + (waiting if search.confirm_references else 0)
    return (top + 1 + refs) * search.confirm_seeds if top > 0 else 0


def recorded(study: optuna.Study) -> list[dict[str, Any]]:
    """The confirmation probes the study holds: a finished round's, or those of a round stopped part-way."""
    return list((study.user_attrs.get(ATTR) or {}).get("probes", []))


def candidates(trials: list[optuna.trial.FrozenTrial], top: int) -> list[optuna.trial.FrozenTrial]:
    """The ``top`` cheapest probed trials, neither the baseline nor a reference, whose verdict is feasible or within
    noise."""
    ok = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
          and t.user_attrs.get("verdict") in ("feasible", "within noise") and "duplicate_of" not in t.user_attrs
          and not t.user_attrs.get("baseline") and not t.user_attrs.get("reference")]
    return sorted(ok, key=lambda t: t.value)[:top]


def references_of(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Each reference's probe that ended ok (its latest, when a retry probed it again), in the recipe's order."""
    ok = {t.user_attrs["reference"]: t for t in trials if t.user_attrs.get("reference") and t.state == TrialState.COMPLETE
          and t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs}
    return sorted(ok.values(), key=lambda t: t.number)


def nothing_to_confirm(trials: list[optuna.trial.FrozenTrial], top: int) -> str | None:
    """Why the round would probe nothing (None when it has candidates): the sentence the answer carries."""
    if top == 0:
        return "no confirmation round: search.confirm_top is 0 (the same command with --resume --set search.confirm_top=1 runs one)"
    if not candidates(trials, top):
        if baseline_of(trials) is None:
            return "no confirmation round: the baseline has no finished probe to confirm a trial against"
        return "no confirmation round: no trial but the baseline is feasible or within noise, nothing to confirm it against"
    return None


def round_references(trials: list[optuna.trial.FrozenTrial], search: SearchConfig) -> list[optuna.trial.FrozenTrial]:
    """The references the round probes: each one that ended ok, unless ``search.confirm_references`` is false."""
    return references_of(trials) if search.confirm_references else []


def round_configs(trials: list[optuna.trial.FrozenTrial], search: SearchConfig) -> list[optuna.trial.FrozenTrial]:
    """The configurations the round probes once per seed, in its order: the baseline, :func:`round_references` and
    the ``search.confirm_top`` candidates."""
    base = baseline_of(trials)
    refs, cands = round_references(trials, search), candidates(trials, search.confirm_top)
    return ([base] if base is not None else []) + refs + cands


def baseline_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    done = [t for t in trials if t.user_attrs.get("baseline") and t.state == TrialState.COMPLETE
            and t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs]
    return done[-1] if done else None


class Round:
    """Runs the round's probes in alternation and keeps the section of search.json up to date."""

    def __init__(self, setup: Setup, study: optuna.Study, progress: Any, remaining: float, estimate: float,
                 deadline: Deadline | None = None) -> None:
        self.s, self.study, self.progress = setup, study, progress
        self.remaining, self.estimate = remaining, estimate
        self.deadline = deadline or Deadline(None)
        self.probes: list[dict[str, Any]] = []
        self.earlier = recorded(study)
        """Probes earlier parts of this round finished: kept, not probed again."""
        self.spent_before = float(study.user_attrs.get(CONFIRMED_ATTR, 0.0))
        self.interrupted_yuan = 0.0
        """What a probe stopped from outside spent (recorded with no result; probed again on --resume)."""
        self.stop: str | None = None
        """Why the round stopped before its end (the time limit, a signal): ``--resume`` continues it."""
        self._machines: dict[str, str | None] = {}
        self.cut: str | None = None
        """Why the budget cut the round short."""
        self.late: str | None = None
        """Why the first probe that did not fit the time left waits (the round's shorter probes go on)."""

    def run(self) -> dict[str, Any]:
        """The round's probes and its section of search.json; for a study :func:`nothing_to_confirm` lets through.
        When the round stops before its end (:attr:`stop`), the section holds its finished probes, marked running."""
        s = self.s.base.search
        trials = self.study.get_trials(deepcopy=False)
        configs, base, refs = round_configs(trials, s), baseline_of(trials), round_references(trials, s)
        seeds = [self.s.base.probe.seed + 1 + r for r in range(s.confirm_seeds)]
        here = machine_id()
        for r, seed in enumerate(seeds):
            k = r % len(configs)
            for t in configs[k:] + configs[:k]:
                if done := self._at(t.number, seed):
                    self.probes.extend(p for p in done if p not in self.probes)
                    continue
                if not self._one(trials, t, r, seed):
                    break
            else:
                for c in self._partners(configs, seed, here):  # the seed's pairs, each on this machine
                    if not self._one(trials, c, r, seed, partner=True):
                        break
            if self.cut or self.stop:
                break
        self.stop = self.stop or (self.late if not self.cut else None)
        if self.stop:
            self._save()
            return self.study.user_attrs[ATTR]
        section = decide(self.s.base, self.s.profile, configs, base, self.probes, self.cut, references=refs)
        if not s.confirm_references and references_of(trials):
            section["references_left_out"] = True
        self.study.set_user_attr(ATTR, section)
        return section

    def _at(self, number: int, seed: int) -> list[dict[str, Any]]:
        """The round's probes of trial ``number`` at ``seed`` so far, this part's and earlier parts'."""
        return [p for p in (*self.probes, *self.earlier) if p["trial"] == number and p["seed"] == seed]

    def _machine(self, probe: dict[str, Any]) -> str | None:
        """The machine a round probe ran on: as recorded with it, else as its summary says (None: not recorded)."""
        if "machine" in probe:
            return probe["machine"]
        if probe["run_dir"] not in self._machines:
            self._machines[probe["run_dir"]] = _summary(probe["run_dir"]).get(MACHINE)
        return self._machines[probe["run_dir"]]

    def _one(self, trials: list[optuna.trial.FrozenTrial], t: optuna.trial.FrozenTrial, r: int, seed: int, *,
             partner: bool = False) -> bool:
        """Probes ``t`` at ``seed`` where the budget and the time left allow; False when the round stops here (the
        budget, :attr:`cut`; a signal, :attr:`stop`). A probe that does not fit the time left waits (:attr:`late`)."""
        need = self.estimate + grace_yuan(int(t.user_attrs.get("devices", self.s.base.system.world_size)), self.s.profile)
        if self.remaining < need:  # a probe admitted with less would have its timeout capped below its length
            self.cut = f"cut short by the budget: {self.remaining:.4g} yuan left, a probe is estimated at {need:.4g}"
            return False
        expected = expected_probe_s(trials, [*self.probes, *self.earlier], self.s.base.probe.timeout_s, of=t)
        what = f"the probe of trial {t.number} at seed {seed} again on this machine" if partner else "the next probe"
        if (why := self.deadline.why_not(expected, what=what)) is not None:
            self.late = self.late or why
            return True
        if not self._probe(t, r, seed, partner=partner):
            self.stop = INTERRUPTED
            return False
        return True

    def _partners(self, configs: list[optuna.trial.FrozenTrial], seed: int, here: str) -> list[optuna.trial.FrozenTrial]:
        """Where a configuration has a probe at ``seed`` on this machine, the configurations probed at ``seed`` on
        other machines only: probed again here, so that each pair of the seed has both its probes on one machine (a
        probe that recorded no machine counts as on this one)."""
        def on_here(p: dict[str, Any]) -> bool:
            return (m := self._machine(p)) is None or m == here

        done = {c.number: self._at(c.number, seed) for c in configs}
        if not any(on_here(p) for ps in done.values() for p in ps):
            return []
        return [c for c in configs if done[c.number] and not any(on_here(p) for p in done[c.number])]

    def _save(self) -> None:
        """The round so far, in the study: its finished probes and what the new ones spent."""
        spent = sum(p["probe_yuan"] for p in self.probes)
        new = sum(p["probe_yuan"] for p in self.probes if p not in self.earlier)
        self.study.set_user_attr(CONFIRMED_ATTR, self.spent_before + new + self.interrupted_yuan)
        kept = [p for p in self.earlier if p not in self.probes]  # an earlier part's, not reached yet
        self.study.set_user_attr(ATTR, {"running": True, "probes": self.probes + kept, "spent_yuan": spent})

    def _probe(self, t: optuna.trial.FrozenTrial, r: int, seed: int, *, partner: bool = False) -> bool:
        """One probe of the round, recorded in the study (``partner``: probed again on this machine, its seed's other
        probes having run on another); False when a signal stopped it (only its spend recorded, its run dir marked
        abandoned, so ``--resume`` probes it again)."""
        sets = list(t.user_attrs.get("sets", [])) + [f"probe.seed={seed}"]
        recipe = validate(apply_overrides(self.s.base_raw, sets), f"{self.s.source} confirmation of trial {t.number}")
        held = recipe.system.world_size
        cap_s = cost.affordable_s(self.remaining, held, self.s.profile) - KILL_GRACE_S
        recipe = recipe.model_copy(update={"probe": recipe.probe.model_copy(update={"timeout_s": max(1.0, min(recipe.probe.timeout_s, cap_s))})})
        run_id = f"{new_run_id(recipe.name)}-c{r}-t{t.number}"
        self.deadline.started()
        self.progress({"event": "confirm", "number": t.number, "round": r, "seed": seed, "steps": recipe.probe.steps,
                       "baseline": bool(t.user_attrs.get("baseline")), "partner": partner})
        run_dir = str((Path(recipe.probe.out) / run_id).resolve())
        t0 = time.monotonic()
        try:
            res = run_probe(recipe, out=recipe.probe.out, gpu_profile=self.s.gpu_profile, run_id=run_id,
                            progress=lambda n: self.progress({"event": "step", "n": n, "total": recipe.probe.steps}))
            status, summ = res.status, res.summary
        except TunekitError as e:
            status, summ = "invalid", {"reason": e.message}
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from an outer timeout (the command line turns it into this)
            studies.mark_abandoned(run_dir, f"the search was stopped during this confirmation probe of trial {t.number}, "
                                            f"seed {seed}; --resume probes it again")
            self.interrupted_yuan += cost.probe_spend(time.monotonic() - t0, held, self.s.profile).yuan
            self._save()  # what it ran is spent, though it is probed again
            return False
        spend = float(summ.get("cost/probe_yuan", 0.0))
        self.remaining -= spend
        self.probes.append({"trial": t.number, "round": r, "seed": seed, "status": status, "reason": summ.get("reason", ""),
                            "run_dir": run_dir, "probe_yuan": spend, "worker": studies.worker_id(),
                            "wall_s": summ.get("wall_s"), "warm_wall_s": warm_wall_s(summ),
                            "startup_s": summ.get("startup_s"), "machine": summ.get(MACHINE),
                            **({"partner": True} if partner else {})})
        self._save()
        return True


# ---------------------------------------------------------------- the decision (reads the run dirs only)


def _recipe_of(base_raw: dict, t: optuna.trial.FrozenTrial, seed: int) -> Recipe:
    return validate(apply_overrides(base_raw, list(t.user_attrs.get("sets", [])) + [f"probe.seed={seed}"]), "confirmation")


def _pooled(curves: list[list[float]]) -> list[float]:
    """The seeds' reward curves averaged step by step (over the steps every seed ran)."""
    n = min(len(c) for c in curves)
    return [statistics.fmean(c[i] for c in curves) for i in range(n)]


def decide(base: Recipe, profile: Any, configs: list[optuna.trial.FrozenTrial], reference: optuna.trial.FrozenTrial | None,
           probes: list[dict[str, Any]], cut: str | None, *,
           references: list[optuna.trial.FrozenTrial] = ()) -> dict[str, Any]:
    """The confirmation section of search.json: per configuration reward and run length over all seeds, paired
    ratios against the baseline (``reference``) and between the top two candidates, their round-to-round spread, and
    the final verdict; ``paired``: every configuration's paired ratios against the baseline and each of
    ``references`` (``search.references``), which the answer quotes its savings from."""
    s = base.search
    base_raw = base.model_dump(mode="json")
    per: dict[int, dict[str, Any]] = {}
    ok = [p for p in probes if p["status"] == "ok"]
    summaries = {d: _summary(d) for d in {t.user_attrs["run_dir"] for t in configs} | {p["run_dir"] for p in ok}}

    def unit(p: dict[str, Any]) -> Unit:
        return p["round"], summaries[p["run_dir"]].get(MACHINE)

    measured: dict[tuple[int, Unit], Measured] = {}
    own: dict[tuple[int, Unit], float] = {}  # each round's probe priced by its own seed's run length
    for t in configs:
        mine = [p for p in ok if p["trial"] == t.number]
        runs = [(base.probe.seed, t.user_attrs["run_dir"])] + [(p["seed"], p["run_dir"]) for p in mine]
        read = {d: read_probe(_recipe_of(base_raw, t, seed), Path(d), summaries[d], profile) for seed, d in runs}
        readings = {}
        for seed, d in runs:  # one probe a seed for the reward (a partner probe repeats its seed's)
            readings.setdefault(seed, read[d])
        for p in mine:
            if read[p["run_dir"]].measured is not None:
                own[(t.number, unit(p))] = float(read[p["run_dir"]].measured.gpu_seconds())
        r = _recipe_of(base_raw, t, base.probe.seed)
        steps = cost.recipe_run_length(r, _pooled([rd.curve for rd in readings.values()])).steps
        windows = {seed: rd.window for seed, rd in readings.items()}
        reward = reward_of(r, list(windows.values()))
        kind = verdict(reward, s.reward_threshold) if steps is not None else "infeasible"
        per[t.number] = {"trial": t.number, "baseline": bool(t.user_attrs.get("baseline")),
                         "reference": t.user_attrs.get("reference"), "sets": t.user_attrs.get("sets", []),
                         "seeds": list(readings), "reward_per_seed": {str(k): statistics.fmean(w) for k, w in windows.items()},
                         "reward": reward.value, "reward_ci": [reward.low, reward.high], "verdict": kind, "projected_steps": steps}
        if steps is None:
            continue
        length = cost.RunLength(steps, "confirmed")
        for p in mine:
            rd = read_probe(_recipe_of(base_raw, t, p["seed"]), Path(p["run_dir"]), summaries[p["run_dir"]], profile, length=length)
            if rd.measured is not None:
                measured[(t.number, unit(p))] = rd.measured
        per[t.number] |= _priced([m for (n, _), m in measured.items() if n == t.number], profile)
    fixed = {t.number for t in [reference, *references] if t is not None}
    cands = [t for t in configs if t.number not in fixed]
    # how far a pair's ratio moves from round to round, run lengths as each seed's curve gives them: every
    # configuration the rounds ran against the baseline, the references too (the rounds are the blocks of one design)
    spread = round_spread([[own[(t.number, u)] / own[(reference.number, u)] for (n, u) in own
                            if n == t.number and (reference.number, u) in own]
                           for t in configs if t is not reference]) if reference else None
    ratios = {}
    if reference is not None:
        for t in cands:
            ratios[t.number] = _ratios(measured, t.number, reference.number, spread)
    split = split_rounds([(p["trial"], unit(p)) for p in ok])
    final = final_verdict(per, ratios, cands, reference, measured, spread, cut, split=bool(split))
    paired = {str(b): {str(a.number): _ratios(measured, a.number, b, spread) for a in configs if a.number != b}
              for b in sorted(fixed)}
    return {"candidates": [t.number for t in cands], "baseline": reference.number if reference is not None else None,
            "references": {t.user_attrs["reference"]: t.number for t in references}, "paired": paired,
            "seeds": sorted({p["seed"] for p in probes}), "order": [[p["trial"], p["seed"]] for p in probes],
            "probes": probes, "spent_yuan": sum(p["probe_yuan"] for p in probes), "configurations": list(per.values()),
            "ratios_vs_baseline": {str(k): v for k, v in ratios.items()}, "cut_short": cut,
            "round_spread": {"sd_log_ratio": spread.sd, "df": spread.df} if spread else None,
            "split_rounds": split, "partners": [{"trial": p["trial"], "seed": p["seed"], "machine": unit(p)[1]}
                                                 for p in ok if p.get("partner")], **final}


def split_rounds(units: list[tuple[int, Unit]]) -> list[dict[str, Any]]:
    """The rounds whose probes ran on more than one machine, each with the machines each trial's probes of it ran on
    (sorted, None where a probe recorded none); ``units``: each round probe's trial and :data:`Unit`."""
    by_round: dict[int, dict[str, set[str | None]]] = {}
    for n, (r, m) in sorted(units, key=lambda x: (x[1][0], x[0])):
        by_round.setdefault(r, {}).setdefault(str(n), set()).add(m)
    return [{"round": r, "machines": {n: sorted(ms, key=lambda m: (m is None, m or "")) for n, ms in trials.items()}}
            for r, trials in sorted(by_round.items()) if len(set().union(*trials.values())) > 1]


def _priced(rounds: list[Measured], profile: Any) -> dict[str, Any]:
    """A configuration's full run as the round prices it: the geometric mean over its rounds of each round's projected
    wall time (at the run length over all seeds), the rule the paired ratios combine rounds by, so with every round
    complete two configurations' projections stand in their paired cost ratio. Empty when no round measured it."""
    if not rounds:
        return {}
    wall_s = math.exp(statistics.fmean(math.log(m.gpu_seconds() / m.gpus) for m in rounds))
    gpus = rounds[0].gpus
    return {"projected_yuan": cost.yuan(wall_s, gpus, profile), "projected_gpu_hours": wall_s * gpus / cost.SECONDS_PER_HOUR,
            "projected_wall_s": wall_s, "priced_rounds": len(rounds)}


def _summary(run_dir: str) -> dict[str, Any]:
    return read_summary(Path(run_dir)) or {}


def _rounds(measured: dict[tuple[int, Unit], Measured], a: int, b: int) -> list[tuple[Measured, Measured]]:
    """The pairs of ``a``'s and ``b``'s probes that one round ran on one machine."""
    return [(measured[(a, u)], measured[(b, u)]) for (n, u) in measured if n == a and (b, u) in measured]


def _ratios(measured: dict[tuple[int, Unit], Measured], a: int, b: int, spread: Spread | None) -> dict[str, Any] | None:
    rounds = _rounds(measured, a, b)
    if not rounds:
        return None
    steps_only = [(Measured(0.0, c.steady_s, 1, 1), Measured(0.0, r.steady_s, 1, 1)) for c, r in rounds]
    return {"cost": compare(rounds, spread).as_dict(), "step_time": paired_ratio(steps_only).as_dict()}


def _fmt(r: dict[str, Any]) -> str:
    return f"{r['ratio']:.3f}x [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"


def _changes(sets: list[str], reference: list[str]) -> int:
    """How many keys ``sets`` gives a value other than ``reference``'s (a key only one of them sets counts)."""
    a, b = (dict(x.split("=", 1) for x in v) for v in (sets, reference))
    return sum(a.get(k) != b.get(k) for k in a.keys() | b.keys())


def final_verdict(per: dict[int, dict[str, Any]], ratios: dict[int, dict[str, Any] | None], cands: list[optuna.trial.FrozenTrial],
                  reference: optuna.trial.FrozenTrial | None, measured: dict[tuple[int, Unit], Measured], spread: Spread | None,
                  cut: str | None, *, split: bool = False) -> dict[str, Any]:
    """The answer: which configuration(s) it names, and whether the saving is confirmed, within noise, none, or unconfirmed.

    ``per``: each configuration's reward verdict over all seeds; ``ratios``: each candidate's paired comparison with
    the reference (``verdict.compare``); ``measured``: each (trial, round) probe's projection parts, for the comparison
    of the top two, keyed by trial and :data:`Unit` (only the probes of one unit are paired); ``spread``: the paired
    ratios' round-to-round spread (``verdict.round_spread``); ``split``: whether a round ran on more than one machine.

    - confirmed: the cheapest candidate is told apart from the baseline, cheaper, with a feasible reward over all
      seeds, and told apart from the runner-up;
    - within noise: it is not told apart from the baseline (both are named), its reward is within noise of the
      threshold, or the top two are not told apart from each other (both are named: the answer never picks one of
      two configurations the round could not separate);
    - baseline: the cheapest candidate is told apart from the baseline and dearer;
    - unconfirmed: nothing to pair.

    ``named``: the trials the answer names; ``winner``: the one the ``run it`` command runs. Where two are named it is
    the one that changes fewer knobs from the baseline (the baseline itself when it is named), a rule that does not
    depend on the machine's noise. ``saving_ratio``: the cost ratio a saving is quoted from (for two named, the
    smaller saving), None when no saving is confirmed.
    """
    live = [t.number for t in cands if per[t.number]["verdict"] != "infeasible" and ratios.get(t.number)]
    if reference is None or not live:
        unpaired = [str(t.number) for t in cands if split and per[t.number]["verdict"] != "infeasible"]
        why = ("no baseline to pair with" if reference is None else
               f"no round probed the baseline on the machine of trial(s) {', '.join(unpaired)}" if unpaired else
               "no candidate kept a feasible or within-noise reward over all seeds")
        sentence = f"unconfirmed: {why}" + (f"; {cut}" if cut else "")
        return {"winner": None, "named": [], "verdict": "unconfirmed", "final_verdict": sentence, "sentence": sentence,
                "top_two": None, "saving_ratio": None}
    live.sort(key=lambda n: ratios[n]["cost"]["ratio"])
    ref = reference.number
    top_two = None
    if len(live) > 1 and (both := _rounds(measured, live[0], live[1])):
        pair = compare(both, spread)
        top_two = {"trials": live[:2], **pair.as_dict(), "within_noise": not pair.apart}

    def saves(n: int) -> bool:
        x = ratios[n]["cost"]
        return bool(x["apart"]) and x["ratio"] < 1.0 and per[n]["verdict"] == "feasible"

    kind, named, winner, head, why = _ladder(live, ref, per, ratios, top_two, saves)
    saving = max(ratios[n]["cost"]["ratio"] for n in named) if named and all(n != ref and saves(n) for n in named) else None
    sentence = f"{head}: {why}" + (f"; {cut}" if cut else "")
    return {"winner": winner, "named": named, "verdict": kind, "final_verdict": head, "sentence": sentence,
            "top_two": top_two, "saving_ratio": saving}


def _ladder(live: list[int], ref: int, per: dict[int, dict[str, Any]], ratios: dict[int, dict[str, Any] | None],
            top_two: dict[str, Any] | None, saves: Callable[[int], bool]) -> tuple[str, list[int], int, str, str]:
    """:func:`final_verdict`'s rungs, the first that holds decides: (kind, named, winner, headline, why)."""
    best, c = live[0], ratios[live[0]]["cost"]
    if not c["apart"] and per[ref]["verdict"] == "infeasible":
        kind, named, winner = "within noise", [best], best
        head = f"within noise: trial {best} and the baseline, trial {ref}, which does not reach the threshold"
        why = f"trial {best} costs {_fmt(c)} the baseline's, {c['why']}"
    elif not c["apart"]:
        kind, named, winner = "within noise", [best, ref], ref
        head = f"within noise: trial {best} and the baseline, trial {ref}"
        why = f"trial {best} costs {_fmt(c)} the baseline's, {c['why']}; run it runs the baseline, which changes no knob"
    elif c["ratio"] > 1.0:
        kind, named, winner = "baseline", [ref], ref
        head = f"no saving: the baseline, trial {ref}"
        why = f"the best candidate, trial {best}, costs {_fmt(c)} the baseline's when run side by side"
    elif top_two and top_two["within_noise"]:
        other = live[1]
        kind, named = "within noise", [best, other]
        winner = min(named, key=lambda n: (_changes(per[n]["sets"], per[ref]["sets"]), named.index(n)))
        head = f"top two within noise: trials {best} and {other}"
        vs = "; ".join(f"trial {n} costs {_fmt(ratios[n]['cost'])} the baseline's (trial {ref})"
                       + ("" if saves(n) else f", not a confirmed saving ({ratios[n]['cost']['why'] or 'reward ' + per[n]['verdict']})")
                       for n in named)
        why = (f"trial {best} over trial {other}: {_fmt(top_two)}, {top_two['why']}; {vs}; run it runs trial {winner}, "
               f"which changes fewer knobs from the baseline")
    elif per[best]["verdict"] != "feasible":
        kind, named, winner = "within noise", [best], best
        head = f"within noise: trial {best}'s reward and the threshold"
        why = f"trial {best} costs {_fmt(c)} the baseline's (trial {ref}), but its reward is within noise of the threshold over all seeds"
    else:
        kind, named, winner = "confirmed", [best], best
        head = f"confirmed: trial {best}"
        why = (f"it costs {_fmt(c)} the baseline's (trial {ref}) full run, cheaper in each of {len(c['per_round'])} rounds, "
               f"clear of the round-to-round spread, its reward holds over all seeds"
               + (f", and it is told apart from the runner-up, trial {live[1]} ({_fmt(top_two)})" if top_two else ""))
    return kind, named, winner, head, why
