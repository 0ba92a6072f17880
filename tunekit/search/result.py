"""What a search found, read back from its study: per-trial rows (numbered as Optuna numbers them, with the
reward's interval, verdict and the full run's length), the answer (the confirmation round's, else the cheapest
feasible trial), the saving against the baseline, the command that runs the priced full run, and the
systems-knob learning check.

``out_dir/search.json`` holds all of it (rewritten after every trial, so a killed
search still leaves its evidence).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from tunekit.search import learning, references, space
from tunekit.estimate import cold_start, cost
from tunekit.config import Recipe, apply_overrides, validate
from tunekit.estimate.profiles import PriceProfile
from tunekit.rundir import SEARCH_RESULT, read_summary, write_json
from tunekit.runners import Handback, runner_for
from tunekit.metrics import MACHINE
from tunekit.search.answer import WORDING, Answer, answers_so_far, apart, decide
from tunekit.search.budget import CONFIRMED_ATTR
from tunekit.search.confirm import ATTR as CONFIRM_ATTR, SKIPPED_ATTR, nothing_to_confirm, round_configs
from tunekit.search.finish import CLAIM_ATTR
from tunekit.search.measure import rewards_of
from tunekit.search.storage import spend_of
from tunekit.workload import import_root


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
    reward_metric: str
    """What the verdicts read (``search.reward_metric``): the training batch's reward or the held-out one."""
    probe_steps: int
    run: dict[str, Any]
    """The full run every trial is projected to (``run.*``) and how its length is decided."""
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    baseline: dict[str, Any] | None
    saving_yuan: float | None
    """Against the baseline: from the confirmation round's paired cost ratio when the saving is confirmed (for the top
    two within noise of each other and both confirmed cheaper, the smaller saving), of the baseline's full run as the
    round projects it (the answer's ``baseline_cost``); from the two trials' projections when unconfirmed; None when
    the answer is within noise of the baseline or the baseline."""
    saving_pct: float | None
    command: str | None
    """The priced full run of the answer in its runner's words (the runner's handback, for its projected steps)."""
    started_as: dict[str, Any] = field(default_factory=dict)
    """How the search was started: the recipe it was given and its ``--set`` overrides."""
    verdict: str = "none"
    """confirmed / within noise / baseline (no saving) / unconfirmed / none (no feasible trial)."""
    answer: str = ""
    """The verdict in one sentence."""
    reaches: dict[str, Any] = field(default_factory=dict)
    """The answer (:class:`tunekit.search.answer.Answer`): its trial, whether and how it reaches the threshold, the
    reward quoted for it, what settles a reward within noise, the closest configuration when none reaches it, and
    after how many full runs the saving pays for the search."""
    confirmation: dict[str, Any] | None = None
    learning: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    confirmed_by: str | None = None
    """The worker (``host:pid``) that ran the confirmation round; with several workers on one study, exactly one."""
    resume: str | None = None
    """For a search that stopped before its end (its time limit, a signal): the command that continues it."""
    references_waiting: list[str] = field(default_factory=list)
    """References (``search.references``) no trial has probed yet: each is enqueued in the first part whose time left
    fits its probe (:mod:`tunekit.search.references`); the answer says it is not probed yet."""
    handback_files: dict[str, str] = field(default_factory=dict)
    """Files the ``command`` reads (name -> text), written into ``out_dir`` next to search.json."""

    @property
    def json_path(self) -> Path:
        return Path(self.out_dir) / SEARCH_RESULT

    def record(self) -> dict[str, Any]:
        """search.json's content."""
        return {k: v for k, v in asdict(self).items() if k != "handback_files"}

    def write(self) -> None:
        for name, text in self.handback_files.items():
            (Path(self.out_dir) / name).write_text(text)
        write_json(self.json_path, self.record())


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def row_of(t: optuna.trial.FrozenTrial, profile: PriceProfile) -> dict[str, Any]:
    """One trial as search.json, the table and the live line show it."""
    ua = t.user_attrs
    status = ua.get("status", "running" if t.state == TrialState.RUNNING else t.state.name.lower())
    return {
        "number": t.number, "state": t.state.name, "baseline": bool(ua.get("baseline")), "reference": ua.get("reference"),
        "params": dict(t.params),
        "sets": ua.get("sets", []), "status": status, "verdict": ua.get("verdict") if status == "ok" else None,
        "reason": ua.get("reason", ""), "projected_yuan": _finite(t.value) if t.state == TrialState.COMPLETE else None,
        "projected_steps": ua.get("projected_steps"), "run_rule": ua.get("run_rule"),
        "reward": ua.get("reward"), "reward_ci": ua.get("reward_ci"), "learning_of": ua.get("learning_of"),
        "own_reward": ua.get("own_reward"), "own_reward_ci": ua.get("own_reward_ci"),
        "feasible": status == "ok" and ua.get("verdict") == "feasible", "probe_yuan": spend_of(t, profile),
        "wall_s": ua.get("wall_s"), "run_dir": ua.get("run_dir"), "duplicate_of": ua.get("duplicate_of"),
        "retry_of": ua.get("retry_of"), "worker": ua.get("worker"), "loadtest_qps": ua.get("loadtest_qps"),
        "loadtest_error": ua.get("loadtest_error"), **_probe_facts(ua, status),
    }


_FACTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "warm_priced": cold_start.warm_priced, "machine": lambda summary: summary.get(MACHINE)}
"""What :func:`_probe_facts` reads off a probe's summary for a trial that did not record it."""


def _probe_facts(ua: Mapping[str, Any], status: str) -> dict[str, Any]:
    """``warm_priced`` (an ok trial's run priced with a warm start, :func:`~tunekit.estimate.cold_start.warm_priced`)
    and ``machine`` (:data:`~tunekit.metrics.MACHINE`) as the objective recorded them for a trial's probe;
    what a trial of an older study did not record, read off its probe's summary, once (as unrecorded where that is
    moved or unreadable)."""
    facts = {"warm_priced": bool(ua.get("warm_priced")), "machine": ua.get("machine")}
    missing = [k for k in _FACTS if k not in ua and (k != "warm_priced" or status == "ok")]
    if not missing or not ua.get("run_dir"):
        return facts
    try:
        summary = read_summary(Path(ua["run_dir"]))
    except (OSError, ValueError):  # a summary moved or unreadable says nothing
        return facts
    return facts | ({k: _FACTS[k](summary) for k in missing} if summary else {})


def label(row: Mapping[str, Any]) -> str:
    """What a trial came to, in one word or two: its verdict when its probe ended ok, else its status."""
    return row["verdict"] or row["status"] if row["status"] == "ok" else row["status"]


def handback(base_raw: Mapping[str, Any], best: Mapping[str, Any], steps: int, out_dir: Path,
             profile: PriceProfile, gpu_profile: str | None = None) -> Handback:
    """The answer's full run in its runner's words, run as printed from ``out_dir`` (where its files are written):
    the recipe's file paths absolute, and the directory of ``task.reward``'s module on ``PYTHONPATH``. The probe's
    timeout is raised to twice the projected wall time, so the priced run is not cut short, and its run directory
    is written beside the search's output directory (``<out_dir>-full-run``), not among its probes, which the
    search's report reads. ``gpu_profile``: the search's ``--gpu-profile`` (a file made absolute), passed on to a run
    tunekit prices."""
    recipe = validate(apply_overrides(dict(base_raw), list(best["sets"])), "the search's answer").with_absolute_paths(Path.cwd())
    wall_s = cost.affordable_s(best["projected_yuan"] or 0.0, recipe.system.world_size, profile)
    full = Path(out_dir).resolve()
    probe = recipe.probe.model_copy(update={"timeout_s": max(recipe.probe.timeout_s, 2 * wall_s),
                                            "out": str(full.with_name(f"{full.name}-full-run"))})
    if gpu_profile and Path(gpu_profile).is_file():
        gpu_profile = str(Path(gpu_profile).resolve())
    hb = runner_for(recipe).handback(recipe.model_copy(update={"probe": probe}), steps, gpu_profile=gpu_profile)
    root = import_root(recipe.task.reward)
    path = f"export PYTHONPATH={shlex.quote(str(root))}:$PYTHONPATH && " if root else ""
    return Handback(command=f"cd {shlex.quote(str(Path(out_dir).resolve()))} && {path}{hb.command}", files=hb.files)


def _effective(row: Mapping[str, Any], keys: list[str], base_raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every space key's value in this trial: sampled, or else the recipe's own."""
    return {k: row["params"].get(k, space.encode(space.lookup(base_raw, k))) for k in keys}


def _overrides(row: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The keys outside the search space a trial sets (a reference's ``set``: another framework's defaults), each
    with its value as YAML reads it."""
    out = {}
    for item in row.get("sets") or []:
        key, _, value = str(item).partition("=")
        if key not in keys:
            out[key] = yaml.safe_load(value)
    return out


def learning_check(rows: list[dict[str, Any]], base: Recipe, base_raw: Mapping[str, Any],
                   section: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Pairs of finished probes that differ only in systems knobs, compared (:mod:`tunekit.search.learning`): the
    ``mismatches`` that hold, and those ``cleared`` over the confirmation round's seeds."""
    keys = [p.key for p in base.search.space]
    # every finished probe, feasible or not: a systems knob that makes learning fail is the case to catch
    ok = [r for r in rows if r["duplicate_of"] is None and r["status"] == "ok"]
    per_seed = {c["trial"]: list(c["reward_per_seed"].values()) for c in (section or {}).get("configurations", [])}
    # a reference sets keys outside the space (a learning rate, say): every trial has them, at the recipe's value
    resolved, extra = base.model_dump(mode="json"), {k for r in ok for k in _overrides(r, keys)}
    effective = {r["number"]: _effective(r, keys, base_raw) | {k: space.lookup(resolved, k) for k in extra}
                 | _overrides(r, keys) for r in ok}
    compared, found = learning.check_pairs([(r["number"], effective[r["number"]], rewards_of(r["run_dir"])) for r in ok],
                                           base.search.reward_window, per_seed)
    return {"pairs_compared": compared, "mismatches": [m.as_dict() for m in found if m.holds],
            "cleared": [m.as_dict() for m in found if not m.holds], "z": learning.Z, "scope": "probes that ended ok",
            "method": "last-window and whole-curve mean reward; bound = Z x combined standard error of the per-step means; "
                      "a flagged pair the confirmation round ran is decided again over its seeds"}


def _verdict(ans: Answer, rows: list[dict[str, Any]], section: dict[str, Any] | None,
             skipped: str | None) -> tuple[dict[str, Any] | None, str, str]:
    """The answer's row, the saving's verdict and its sentence: the confirmation round's when it picked the answer."""
    if ans.trial is None:
        return None, "none", ans.lines()[0]
    best = next(r for r in rows if r["number"] == ans.trial)
    if section is not None and section.get("winner") == ans.trial:
        return best, section["verdict"], section["sentence"]
    why = skipped or "no confirmation round ran"
    if section is not None and section.get("winner") is not None:
        why = f"the confirmation round named trial {section['winner']}, whose reward over its seeds is below the threshold"
    elif section is not None:
        why = section["sentence"]
    return best, "unconfirmed", (f"trial {ans.trial} is the cheapest configuration that {WORDING[ans.verdict]}, not "
                                 f"confirmed side by side ({why})")


def _round_saving(ans: Answer, baseline: dict[str, Any]) -> dict[str, Any] | None:
    """The answer's comparison with the baseline where the confirmation round told their costs apart, the answer the
    cheaper, though the round confirmed no saving because the answer's reward is within noise of the threshold: the
    answer reaches it within noise, so its saving is quoted as its comparison lines quote it. None otherwise."""
    if ans.verdict != "within noise":
        return None
    vs = next((a for a in ans.against if a["trial"] == baseline["number"] and a["priced"]), None)
    ratio = (vs or {}).get("ratio") or {}
    return vs if ratio.get("apart") and ratio["ratio"] < 1.0 else None


def build_result(study: optuna.Study, base: Recipe, base_raw: Mapping[str, Any], profile: PriceProfile, reason: str,
                 out_dir: Path, ref: str | None, sets: list[str], *,
                 storage: optuna.storages.BaseStorage | None = None, resume: str | None = None,
                 gpu_profile: str | None = None) -> SearchResult:
    """The search's result from its study; ``storage``: the one the search opened the study in (named, without its
    password, in the result); ``resume``: the command that continues a search stopped before its end;
    ``gpu_profile``: the search's ``--gpu-profile`` (None: detected), for the handed-back run."""
    engine = getattr(storage, "engine", None)  # an RDBStorage's SQLAlchemy engine
    storage_url = engine.url.render_as_string(hide_password=True) if engine is not None else ""
    trials = study.get_trials(deepcopy=False)
    rows = _said_stopped([row_of(t, profile) for t in trials])
    for r, y in zip(rows, answers_so_far(rows, threshold=base.search.reward_threshold, seed=base.probe.seed)):
        r["best_so_far"] = y
    section = study.user_attrs.get(CONFIRM_ATTR)
    section = section if section and not section.get("running") else None
    spent = sum(r["probe_yuan"] for r in rows) + float(study.user_attrs.get(CONFIRMED_ATTR, 0.0))
    waiting = [r["name"] for r in references.unprobed(study.user_attrs, trials)]
    s = base.search
    # where no round has finished (none recorded, or one stopped part-way): why none will run, else the round still
    # to run, its configurations and fresh seeds
    no_round = nothing_to_confirm(trials, s.confirm_top) if section is None else None
    planned = None
    if section is None and no_round is None:
        planned = ([t.number for t in round_configs(trials, s)], s.confirm_seeds)
    ans = decide(rows, section, threshold=s.reward_threshold, seed=base.probe.seed, probe_steps=base.probe.steps,
                 stop_reason=reason, spent_yuan=spent, waiting=waiting, planned=planned, no_round=no_round)
    best, kind, sentence = _verdict(ans, rows, section, study.user_attrs.get(SKIPPED_ATTR))
    baselines = [r for r in rows if r["baseline"] and r["state"] == "COMPLETE"]
    baseline = baselines[-1] if baselines else None
    notes, saving, pct = [], None, None
    if baseline is not None and best is not None and best is not baseline:
        if baseline["verdict"] in (None, "infeasible") or not baseline["projected_yuan"]:  # as the answer prices it
            notes.append(f"the baseline (trial {baseline['number']}) is {label(baseline)}: there is no saving to report against it.")
        elif section is not None and section.get("saving_ratio") is not None:  # the round's paired ratio, not two probes run at different times
            ratio, base_yuan = section["saving_ratio"], (ans.baseline_cost or {}).get("yuan", baseline["projected_yuan"])
            pct, saving = 100.0 * (1.0 - ratio), base_yuan * (1.0 - ratio)
        elif (vs := _round_saving(ans, baseline)) is not None:  # the round told the costs apart; the reward, not
            saving, pct = vs["saving_yuan"], vs["saving_pct"]     # the saving, is what is within noise
        elif kind == "unconfirmed":
            saving = baseline["projected_yuan"] - best["projected_yuan"]
            pct = 100.0 * saving / baseline["projected_yuan"]
            notes.append(f"the saving compares two probes {apart(best, baseline)}, unconfirmed side by side.")
    if section is not None and (split := section.get("split_rounds")):
        again = ", ".join(f"trial {x['trial']} at seed {x['seed']}" for x in section.get("partners") or [])
        notes.append(f"the confirmation round was resumed on another machine: round(s) {', '.join(str(x['round']) for x in split)} "
                     "ran on more than one, and a pair of probes from two machines is not compared"
                     + (f" (probed again on the machine of the probes they pair with: {again})." if again else "."))
    check = learning_check(rows, base, base_raw, section)
    notes += [m["sentence"] for m in check["mismatches"] + check["cleared"]]
    steps = _confirmed_steps(section, best)
    hb = handback(base_raw, best, steps, out_dir, profile, gpu_profile) if best and steps else None
    return SearchResult(
        study=study.study_name, storage=storage_url, out_dir=str(out_dir), recipe=base.name, profile=profile.name,
        budget_yuan=float(study.user_attrs.get("budget_yuan", 0.0)),
        spent_yuan=spent, reaches=ans.with_saving(saving).as_dict(),
        stop_reason=reason, reward_threshold=base.search.reward_threshold, reward_window=base.search.reward_window,
        reward_metric=base.search.reward_metric, probe_steps=base.probe.steps, run=base.run.model_dump(), trials=rows, best=best, baseline=baseline,
        saving_yuan=saving, saving_pct=pct, verdict=kind, answer=sentence, confirmation=section,
        command=hb.command if hb else None, started_as={"recipe": ref, "sets": sets}, learning=check, notes=notes,
        handback_files=hb.files if hb else {}, resume=resume, references_waiting=waiting,
        confirmed_by=(study.user_attrs.get(CLAIM_ATTR) or {}).get("worker"),
    )


def _said_stopped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each trial a stop ended (Ctrl-C, SIGTERM, a killed search: failed with no reason of its own)
    said to be ``stopped``, and where it was probed again."""
    again = {r["retry_of"]: r["number"] for r in rows if r.get("retry_of") is not None}
    for r in rows:
        if r["state"] == "FAIL" and r["status"] == "fail" and not r["reason"]:
            r["status"] = "stopped"
            r["reason"] = (f"stopped before its end; probed again as trial {again[r['number']]}" if r["number"] in again
                           else "stopped before its end; --resume probes it again")
    return rows


def _confirmed_steps(section: dict[str, Any] | None, best: dict[str, Any] | None) -> int | None:
    """The answer's full-run steps: over the confirmation round's seeds when it ran, else its trial's."""
    if best is None:
        return None
    for c in (section or {}).get("configurations", []):
        if c["trial"] == best["number"] and c["projected_steps"]:
            return int(c["projected_steps"])
    return best["projected_steps"]
