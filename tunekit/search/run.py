"""Run (or resume) a search: the loop that asks Optuna for trials until trials, space or budget run out.

- budget: before each probe the next spend is estimated (median of the probes so
  far; for the first, the recipe's timeout on its devices, an upper bound) and the
  search stops if spent + estimate + what the probes running in other workers hold
  would pass the budget, with the confirmation round's probes kept back
  (``tunekit.search.confirm``), and each reference not probed yet at its timeout (its own estimate when it is next).
  With several workers on one study, that check and the
  trial's admission run under a study-wide lock (``tunekit.search.lock``); the admitted
  probe holds its estimate (``tunekit.search.budget``) and is stopped if its spend
  passes what the others leave.
- a repeated configuration reuses its earlier result and does not count against ``--trials``.
- time: with ``time_limit_s``, no probe (trial or confirmation) starts that is expected to end after the limit
  (``tunekit.search.deadline``); the search stops there, and ``--resume`` continues it.
- references (``search.references``): the baseline runs first; a reference runs next in the first part whose time
  left fits its timeout, while the space's trials that fit run before it (``tunekit.search.references``); the trials
  ending with one still waiting stop the search at the time limit, so the confirmation round finds every reference
  probed.
- when the trials stop, the confirmation round runs (with several workers, in exactly one of them, once no other
  worker's trial runs: ``tunekit.search.finish``), then
  search.json is written a last time.
"""

from __future__ import annotations

import json
import shlex
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tunekit.config import Recipe
from tunekit.search import confirm, finish, references, storage as studies
from tunekit.search.deadline import (INTERRUPTED, Deadline, Deferred, check_first_part, expected_probe_s, resumable,
                                     stopped)
from tunekit.search.answer import short, so_far
from tunekit.search.budget import KILL_GRACE_S, RESERVED_ATTR, admitted_at, estimate_next, held, probing, study_spent
from tunekit.search.lock import StudyLock
from tunekit.search.objective import Objective, ProgressCb
from tunekit.search.result import SearchResult, build_result, row_of
from tunekit.search.setup import Setup, make_setup, open_study

MAX_REPEATS = 20
"""The sampler proposing only tried configurations this many times in a row ends the search."""


def run_search(recipe: Recipe, *, budget_yuan: float, trials: int = 12, storage: str | None = None, resume: bool = False,
               out_dir: str | Path = "search-out", gpu_profile: str | None = None, progress_cb: ProgressCb | None = None,
               study_name: str | None = None, recipe_ref: str | None = None, base_overrides: list[str] | None = None,
               seed: int | None = None, source: str | None = None, time_limit_s: float | None = None) -> SearchResult:
    """Run (or resume) the study until ``trials`` trials are probed or the next probe would pass the budget,
    then confirm the top candidates against the baseline.

    ``time_limit_s``: seconds from this call after which no probe may end; a probe expected to end later is not
    started, and the search stops with a stop reason that begins ``time limit`` (``--resume`` continues it).

    Bad input raises ConfigError before the output directory or the study is created or changed.
    ``recipe_ref``/``base_overrides`` only shape the printed ``tunekit probe`` command of the best configuration.
    """
    if not resume:
        check_first_part(recipe, time_limit_s)
    deadline = Deadline(time_limit_s)
    out_dir = Path(out_dir)
    progress = progress_cb or (lambda _e: None)
    name = study_name or recipe.name
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trial outcomes are reported by progress_cb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        setup = make_setup(recipe, budget_yuan, trials, out_dir, gpu_profile, source or f"recipe {recipe.name}")
        study, opened = open_study(setup, storage, name, resume, out_dir, seed, trials)
        retried = studies.recover(study, opened)
        objective = Objective(setup, study, progress, deadline)
        progress({"event": "start", "study": name, "budget": budget_yuan, "trials": trials, "retried": retried,
                  "done": _probed(study.get_trials(deepcopy=False))})
        reason = _loop(study, opened, objective, setup, trials, out_dir, progress, recipe_ref, base_overrides or [], deadline)
    again = resume_command(ref=recipe_ref, sets=base_overrides or [], budget_yuan=budget_yuan, trials=trials,
                           out_dir=out_dir, study=name, storage=storage, time_limit_s=time_limit_s, seed=seed)
    return _finish(study, opened, setup, reason, out_dir, recipe_ref, base_overrides or [], progress, deadline, again)


def _distinct(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Configurations of the space probed or being probed (by any worker); a reference that sets keys outside the
    space is not one of them."""
    done = [t.params for t in trials if (t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.RUNNING and RESERVED_ATTR in t.user_attrs)) and not t.user_attrs.get("reference_sets")]
    return len({json.dumps(p, sort_keys=True) for p in done})


def _probed(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Trials that count against ``--trials``: finished ones that were not a repeat of an earlier configuration."""
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) and "duplicate_of" not in t.user_attrs for t in trials)


def _repeats_in_a_row(trials: list[optuna.trial.FrozenTrial]) -> int:
    n = 0
    for t in sorted(trials, key=lambda t: t.number, reverse=True):
        if "duplicate_of" not in t.user_attrs:
            break
        n += 1
    return n


def _loop(study: optuna.Study, storage: optuna.storages.BaseStorage, objective: Objective, setup: Setup, n_trials: int,
          out_dir: Path, progress: ProgressCb, ref: str | None, sets: list[str], deadline: Deadline) -> str:
    lock = StudyLock(storage, study.study_name)
    while True:
        lock.acquire()  # the objective releases it once its trial is admitted (see tunekit.search.lock)
        try:
            reason = _admission(study, objective, setup, n_trials, progress, deadline)
            if reason is not None:
                return reason
            objective.admitted = lock.release
            finished: list[optuna.trial.FrozenTrial] = []
            try:
                study.optimize(objective, n_trials=1, catch=(), callbacks=[lambda _s, t: finished.append(t)])
            except KeyboardInterrupt:
                return INTERRUPTED
            except Deferred as d:  # the sampled trial's runner does not fit the time left: FAIL, retried on --resume
                return d.reason
        finally:
            lock.release()
        _write(study, storage, setup, "running", out_dir, ref, sets)
        row = row_of(finished[-1], setup.profile) if finished else None
        progress({"event": "done", "trial": row, "spent": study_spent(study, setup.profile),
                  "best": _so_far(study.get_trials(deepcopy=False), setup), "budget": setup.budget})


def _so_far(trials: list[optuna.trial.FrozenTrial], setup: Setup) -> str | None:
    return so_far([row_of(t, setup.profile) for t in trials], threshold=setup.base.search.reward_threshold,
                  seed=setup.base.probe.seed)


def _admission(study: optuna.Study, objective: Objective, setup: Setup, n_trials: int, progress: ProgressCb,
               deadline: Deadline) -> str | None:
    """Why no further trial may start (None: one may), read under the study lock; sets what the objective may spend.

    The next trial is the first one queued (the baseline, a retry), else a waiting reference when it fits the time
    left (then queued here), else one the sampler proposes while the trials, counting the waiting references, have
    not ended. A reference that does not fit waits while such trials run; once they end it stops the search at the
    time limit, so the confirmation round never starts before every reference was probed."""
    all_trials = study.get_trials(deepcopy=False)
    refs = references.waiting(study, all_trials, setup)
    queued = [t for t in all_trials if t.state == TrialState.WAITING]
    nxt = min(queued, key=lambda t: t.number) if queued else None
    late = None
    if nxt is None and refs:
        ref = refs[0]
        late = deadline.why_not(ref.seconds, what=_waits(ref))
        if late is None:
            why = _afford(study, objective, setup, all_trials, progress, est=ref.yuan, refs=refs, this=ref)
            if why is None:
                references.enqueue(study, ref)
            return why
    of = nxt if nxt is not None and nxt.user_attrs.get("reference") else None  # unprobed: its timeout bounds it
    expected = expected_probe_s(all_trials, confirm.recorded(study), setup.base.probe.timeout_s, of=of,
                                runners=_runners(setup, nxt))
    why = (_ended(all_trials, objective, n_trials, 0 if nxt is not None else len(refs)) or deadline.why_not(expected)
           or _afford(study, objective, setup, all_trials, progress, refs=refs,
                      est=admitted_at(all_trials, setup.first_estimate, setup.base.system.world_size, setup.profile)))
    if why is not None and late is not None:  # the reference waits for a part it fits in
        return late if stopped(why) else deadline.why_not(refs[0].seconds, what=_waits(refs[0]),
                                                           after=f" and the trials ended ({why})")
    return why


def _runners(setup: Setup, queued: optuna.trial.FrozenTrial | None) -> list[str]:
    """The runners the next trial may run: a queued one's, else every runner the space offers, else the recipe's
    (the objective checks the sampled trial's own once it is known)."""
    if queued is not None and "runner" in queued.params:
        return [queued.params["runner"]]
    offered = [c for p in setup.base.search.space if p.key == "runner" for c in (p.choices or [])]
    return offered if queued is None and offered else [setup.base.runner]


def _waits(ref: references.Waiting) -> str:
    return f"{references.named([ref])}, not probed yet (its timeout and the kill grace),"


def _ended(all_trials: list[optuna.trial.FrozenTrial], objective: Objective, n_trials: int, waiting: int) -> str | None:
    """Why the trials have ended (trial count, the ``waiting`` references counted in; space; repeats), else None."""
    done, running = _probed(all_trials), probing(all_trials)
    if done + running + waiting >= n_trials:
        return (f"reached {n_trials} trials" + (f" ({running} still running in other workers)" if running else "")
                + (f", {waiting} of them for the reference{'s' * (waiting > 1)} not probed yet" if waiting else ""))
    if objective.space_size is not None and _distinct(all_trials) >= objective.space_size:
        return f"tried all {objective.space_size} configurations of the space"
    if _repeats_in_a_row(all_trials) >= MAX_REPEATS:
        return f"the sampler proposed only configurations already tried, {MAX_REPEATS} times in a row"
    return None


def _afford(study: optuna.Study, objective: Objective, setup: Setup, all_trials: list[optuna.trial.FrozenTrial],
            progress: ProgressCb, *, est: float, refs: list[references.Waiting],
            this: references.Waiting | None = None) -> str | None:
    """Why the budget cannot pay the next probe (``est`` yuan; ``this``: the waiting reference it is), None when it
    can, beside what the probes running in other workers hold and what is kept back: the confirmation round's share
    (once a probe was measured; before, ``est`` is a timeout bound) and the bound of each other waiting reference
    (``refs``). Sets what the objective may spend."""
    done = _probed(all_trials)
    used, others = study_spent(study, setup.profile), held(all_trials)
    probes = confirm.probes_needed(setup.base.search, all_trials, waiting=len(refs))
    reserve = probes * admitted_at(all_trials, setup.first_estimate, setup.base.system.world_size, setup.profile) \
        if done else 0.0  # each of the round's probes is admitted with room for its kill grace too
    kept = [r for r in refs if r is not this]
    keep = sum(r.yuan for r in kept)
    objective.remaining, objective.estimate = setup.budget - used - others - reserve - keep, est
    objective.keep_back = reserve + keep
    progress({"event": "budget", "spent": used, "estimate": est, "budget": setup.budget, "done": done,
              "best": _so_far(all_trials, setup)})
    if used + others + est + reserve + keep <= setup.budget:
        return None
    what = "the next probe" if this is None else f"the probe of {references.named([this])} at its timeout"
    return (f"budget: spent {used:.4g} of {setup.budget:g} yuan; {what} (estimated {est:.4g} yuan"
            + (f", plus {others:.4g} held by probes running in other workers" if others else "")
            + (f", plus {reserve:.4g} kept for the confirmation round's {probes} probes" if reserve else "")
            + (f", plus {keep:.4g} kept for {references.named(kept)}, not probed yet, at the probe timeout"
               if kept else "")
            + ") would pass it")


def _write(study: optuna.Study, storage: optuna.storages.BaseStorage, setup: Setup, reason: str, out_dir: Path,
           ref: str | None, sets: list[str], resume: str | None = None) -> SearchResult:
    result = build_result(study, setup.base, setup.base_raw, setup.profile, reason, out_dir, ref, sets, storage=storage,
                          resume=resume, gpu_profile=setup.gpu_profile)
    result.write()
    return result


def resume_command(*, ref: str | None, sets: list[str], budget_yuan: float, trials: int, out_dir: Path, study: str,
                   storage: str | None, time_limit_s: float | None, seed: int | None = None) -> str:
    """The ``tunekit search ... --resume`` line that continues this search where it stopped."""
    argv = ["tunekit", "search", *(["--recipe", ref] if ref else []), *[a for s in sets for a in ("--set", s)],
            "--budget-yuan", f"{budget_yuan:g}", "--trials", str(trials), "--out", str(out_dir), "--study", study,
            *(["--storage", studies.redact(storage)] if storage else []),
            *(["--time-limit", f"{time_limit_s:g}"] if time_limit_s is not None else []),
            *(["--seed", str(seed)] if seed is not None else []), "--resume"]
    return shlex.join(argv)


def _confirm(study: optuna.Study, setup: Setup, progress: ProgressCb, deadline: Deadline) -> str | None:
    """The confirmation round; the stop reason when it stopped before its end (time limit, interrupted), else None."""
    trials = study.get_trials(deepcopy=False)
    if (why := confirm.nothing_to_confirm(trials, setup.base.search.confirm_top)) is not None:
        study.set_user_attr(confirm.SKIPPED_ATTR, why)
        progress({"event": "confirm_skip", "why": why})
        return None
    study.set_user_attr(confirm.SKIPPED_ATTR, None)
    left = setup.budget - study_spent(study, setup.profile)
    rnd = confirm.Round(setup, study, progress, left, estimate_next(trials, setup.first_estimate), deadline)
    progress({"event": "confirm_start", "probes": confirm.probes_needed(setup.base.search, trials),
              "reused": len(rnd.earlier)})
    section = rnd.run()
    if rnd.stop is not None:
        return rnd.stop
    progress({"event": "confirm_done", "sentence": section["sentence"]})
    return None


def _finish(study: optuna.Study, storage: optuna.storages.BaseStorage, setup: Setup, reason: str, out_dir: Path,
            ref: str | None, sets: list[str], progress: ProgressCb, deadline: Deadline, resume: str) -> SearchResult:
    """The confirmation round, in exactly one of the study's workers once no other worker's trial runs
    (:mod:`tunekit.search.finish`); then the answer, built from the study, so every worker gives the same one.
    A search stopped by its time limit or interrupted, before or during the round, leaves the claim free and the
    round's finished probes in the study for ``--resume``."""
    if resumable(reason):
        return _stop(study, storage, setup, reason, out_dir, ref, sets, progress, resume)
    s = setup.base.search
    finish.wait_for_others(study, setup.base.probe.timeout_s, progress)
    if finish.claim(study, storage, (s.confirm_top, s.confirm_seeds, s.confirm_references)):
        if (cut := _confirm(study, setup, progress, deadline)) is not None:
            finish.release(study)
            return _stop(study, storage, setup, cut, out_dir, ref, sets, progress, resume)
        result = _write(study, storage, setup, reason, out_dir, ref, sets)
        finish.done(study, result.record())
    else:
        n = confirm.probes_needed(s, study.get_trials(deepcopy=False))
        limit = (n + 1) * (setup.base.probe.timeout_s + KILL_GRACE_S)
        if (why := finish.wait_for_round(study, limit, progress)) is not None:
            progress({"event": "confirm_skip", "why": why})
    return _stop(study, storage, setup, reason, out_dir, ref, sets, progress, resume)


def _stop(study: optuna.Study, storage: optuna.storages.BaseStorage, setup: Setup, reason: str, out_dir: Path,
          ref: str | None, sets: list[str], progress: ProgressCb, resume: str) -> SearchResult:
    result = _write(study, storage, setup, reason, out_dir, ref, sets,
                    resume if resumable(reason) else None)
    study.set_user_attr("spent_yuan", result.spent_yuan)
    # the bar's last words: the whole spend (the round's included) and the answer, as printed below it
    progress({"event": "stop", "reason": reason, "spent": result.spent_yuan, "budget": setup.budget,
              "best": short(result.reaches), "final": not resumable(reason)})
    return result
