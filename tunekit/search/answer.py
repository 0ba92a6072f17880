"""The search's answer, decided once: which configuration, whether it reaches the threshold, with which reward.

One rule for "reaches the threshold" (:func:`tunekit.search.verdict.verdict` on the configuration's reward
interval): its interval at or above the threshold reaches it; an interval that straddles it reaches it within
noise; an interval below it never makes a configuration the answer. The reward is the confirmation round's (mean
and interval over the seeds it names) when the configuration ran in it, else its single probe's, labelled so; its
projected full-run cost likewise (:func:`cost_of`), so the costs quoted and the round's paired cost ratios come
from the same probes.

:func:`decide` applies the rule to a search's trial rows and confirmation section; the terminal answer, the
progress bar's best so far, search.json and the report's headline all format its :class:`Answer`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tunekit.search.verdict import Interval, Verdict, verdict

WORDING: dict[str, str] = {"feasible": "reaches the threshold", "within noise": "reaches the threshold within noise",
                           "infeasible": "is below the threshold"}
"""How every view says a reward verdict."""


@dataclass(frozen=True)
class Reward:
    """One configuration's reward as the answer quotes it."""

    value: float
    low: float
    high: float
    seeds: list[int]
    confirmed: bool
    """True: the confirmation round's mean over ``seeds``; False: the configuration's single probe."""
    learning_of: int | None = None
    """The earlier trial whose probe's reward this is: the same learning keys and a curve that agreed
    (:mod:`tunekit.search.learning`), so one reading stands for both; None: the configuration's own."""
    own: float | None = None
    """With :attr:`learning_of`: the configuration's own probe's reading."""

    def text(self) -> str:
        """``0.407 [0.391, 0.423] over seeds 0, 1, 2`` or ``0.391 [0.365, 0.417] (single probe, seed 0)``, or
        ``0.708 [0.679, 0.742] (trial 0's probe, seed 0: the same learning; its own 0.728)``."""
        head = f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"
        seeds = ", ".join(map(str, self.seeds))
        if self.confirmed:
            return f"{head} over seeds {seeds}"
        if self.learning_of is not None:
            own = f"; its own {self.own:.3f}" if self.own is not None else ""
            return f"{head} (trial {self.learning_of}'s probe, seed {seeds}: the same learning{own})"
        return f"{head} (single probe, seed {seeds})"


def reward_of(row: Mapping[str, Any], section: Mapping[str, Any] | None, seed: int) -> Reward | None:
    """The reward of trial ``row``: over the confirmation round's seeds when it ran there, else its probe's (or, for
    a trial that learns as an earlier one did, that trial's probe's, labelled so)."""
    for c in (section or {}).get("configurations", []):
        if c.get("trial") == row["number"] and c.get("reward") is not None and c.get("reward_ci"):
            return Reward(float(c["reward"]), *map(float, c["reward_ci"]), [int(s) for s in c.get("seeds", [])], True)
    if row.get("reward") is None or not row.get("reward_ci"):
        return None
    own = row.get("own_reward")
    return Reward(float(row["reward"]), *map(float, row["reward_ci"]), [seed], False, row.get("learning_of"),
                  float(own) if own is not None else None)


@dataclass(frozen=True)
class Cost:
    """One configuration's projected full run as the answer quotes it."""

    yuan: float
    seeds: list[int]
    confirmed: bool
    """True: the confirmation round's projection over the rounds that ran ``seeds`` (the probes its paired cost ratios
    compare); False: the configuration's single probe's."""
    warm: bool = False
    """The single probe's run priced with a warm start (:func:`tunekit.estimate.cold_start.warm_priced`)."""

    def text(self) -> str:
        """``0.0841 yuan over the confirmation round's seeds 1, 2`` or ``0.0351 yuan (single probe, seed 0)``."""
        seeds = ", ".join(map(str, self.seeds))
        if self.confirmed:
            return f"{self.yuan:.4g} yuan over the confirmation round's seed{'s' * (len(self.seeds) > 1)} {seeds}"
        warm = "; priced with its own warm start, no cold start of its shapes measured: a low price" if self.warm else ""
        return f"{self.yuan:.4g} yuan (single probe, seed {seeds}{warm})"


def cost_of(row: Mapping[str, Any], section: Mapping[str, Any] | None, seed: int) -> Cost | None:
    """The projected full run of trial ``row``: the confirmation round's when it priced it, else its own probe's.
    Never the one for one configuration and the other for another where both ran in the round: the round's probes
    ran side by side, the trials' probes at other times on a machine loaded otherwise."""
    for c in (section or {}).get("configurations", []):
        if c.get("trial") == row["number"] and c.get("projected_yuan") is not None:
            seeds = sorted({int(p["seed"]) for p in section.get("probes", []) if p.get("trial") == row["number"]
                            and p.get("status") == "ok"})
            return Cost(float(c["projected_yuan"]), seeds, True)
    if row.get("projected_yuan") is None:
        return None
    return Cost(float(row["projected_yuan"]), [seed], False, bool(row.get("warm_priced")))


def reach(reward: Reward, threshold: float) -> Verdict:
    """The one rule: where ``reward``'s interval lies against ``threshold``."""
    return verdict(Interval(reward.value, reward.low, reward.high), threshold)


@dataclass
class Answer:
    """What a search answers; every view formats this, none re-decides it."""

    threshold: float
    trial: int | None = None
    verdict: str | None = None
    """feasible / within noise (never infeasible: a configuration below the threshold is never the answer)."""
    reward: dict[str, Any] | None = None
    """:class:`Reward` as a dict, with its ``text``."""
    projected_yuan: float | None = None
    cost: dict[str, Any] | None = None
    """:class:`Cost` as a dict, with its ``text``: the projection ``projected_yuan`` is, and whose."""
    baseline_cost: dict[str, Any] | None = None
    """The baseline's :class:`Cost` as a dict, by the same rule as ``cost``: what a saving is quoted against."""
    settle: str = ""
    """For a reward within noise: what more seeds would settle it."""
    surely: dict[str, Any] | None = None
    """For an answer within noise: the cheapest configuration whose interval lies at or above the threshold, if any."""
    closest: dict[str, Any] | None = None
    """When nothing reaches the threshold: the configuration with the highest reward, its shortfall, what to change."""
    tied: dict[str, Any] | None = None
    """Where the confirmation round named two configurations it could not tell apart in cost: the other one and the
    answer's paired cost ratio over it (None where the round measured none)."""
    against: list[dict[str, Any]] = field(default_factory=list)
    """The answer's full run against the baseline and each reference (``search.references``): :func:`compare`."""
    search_yuan: float = 0.0
    saving_yuan: float | None = None
    payback_runs: int | None = None
    """Full runs after which the saving has paid for the search's own probes."""
    title: str = ""
    """The headline, e.g. ``Cheapest configuration that reaches the threshold within noise: trial 1``."""

    def with_saving(self, saving_yuan: float | None) -> "Answer":
        """The answer with the saving a full run makes, and after how many full runs it pays for the search."""
        if self.trial is not None and saving_yuan is not None and saving_yuan > 0:
            self.saving_yuan, self.payback_runs = saving_yuan, max(1, math.ceil(self.search_yuan / saving_yuan))
        return self

    def lines(self) -> list[str]:
        """The answer as the terminal prints it, one sentence a line."""
        if self.trial is None:
            return [_none_line(self)]
        noise = " within noise" if self.verdict == "within noise" else ""
        lines = [f"trial {self.trial} reaches the threshold {self.threshold:g}{noise}: reward {self.reward['text']}"
                 + (f"; {self.settle}" if self.settle else "")]
        if self.surely is not None:
            sure, ratio = self.surely, self.surely.get("side_by_side")
            price = f"its full run projected {sure['cost']['text']}"
            if ratio:
                (lo, hi), how = quoted_interval(ratio)
                price += (f"; side by side trial {self.trial} costs {ratio['ratio']:.3f}x [{lo:.3f}, {hi:.3f}] of it "
                          f"({self.cost['text']}; {how})")
            lines.append(f"the cheapest configuration that reaches it beyond noise is trial {sure['trial']}, reward "
                         f"{sure['reward']['text']}; {price}")
        if self.tied is not None and (self.surely is None or self.surely["trial"] != self.tied["trial"]):
            lines.append(_tied_line(self.trial, self.tied))  # (the line above quotes the ratio where it is that trial)
        return lines + [c["text"] for c in self.against] + [_payback_line(self)]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wording": WORDING.get(self.verdict or "", ""), "lines": self.lines()}


def _quoted(r: Reward | Cost) -> dict[str, Any]:
    """A quoted figure as search.json holds it, with the text every view prints."""
    return {**asdict(r), "text": r.text()}


MOST_SEEDS = 50
"""Seeds past which settling a straddling interval is no advice worth giving: the mean is as good as on the
threshold."""


def settle(reward: Reward, threshold: float, seed_yuan: float | None = None, *, planned: int | None = None,
           no_round: str | None = None) -> str:
    """How many seeds would put a straddling interval on one side, if the mean holds (the interval narrows as one
    over the square root of the seeds); from the configuration's own reading where its reward is an earlier trial's
    (the round probes the configuration itself); with ``seed_yuan``, what the round's further seeds would cost (its
    probes of a seed: each configuration the round runs). ``planned``: where the confirmation round has not run, the
    fresh seeds it will run (``search.confirm_seeds``): the advice never asks for fewer, and prices the whole round.
    ``no_round``: why no confirmation round will run, said instead of a command that would run none."""
    value = reward.own if reward.learning_of is not None and reward.own is not None else reward.value
    gap, half, n = abs(value - threshold), (reward.high - reward.low) / 2, max(1, len(reward.seeds))
    if gap < 1e-9:
        return "its mean sits on the threshold: more seeds will not settle it; change the threshold or the run"
    need = max(n + 1, math.ceil(n * (half / gap) ** 2))
    if need > MOST_SEEDS:
        side = "below" if reward.value < threshold else "above"
        return (f"its mean is {gap:.3g} {side} the threshold, {gap / half:.0%} of the interval's half-width: settling "
                f"it would take about {need} seeds, so read it as at the threshold (or change the threshold)")
    own = f" (its own reading {value:.3f})" if value != reward.value else ""
    head = f"about {need} seeds in all would settle it if its mean{own} holds"
    if no_round is not None:
        return f"{head}; but {no_round}"
    if planned is None:
        price = f", about {seed_yuan * (need - n):.3g} yuan more in probes" if seed_yuan else ""
        return (f"{head} (the same command with --resume --set search.confirm_seeds={need - 1} runs the round's "
                f"further seeds{price}; it has {n})")
    fresh = max(need - 1, planned)
    price = f", about {seed_yuan * fresh:.3g} yuan in probes" if seed_yuan else ""
    more = f" --set search.confirm_seeds={fresh}" if fresh != planned else ""
    return (f"{head} (the confirmation round has not finished: the same command with --resume{more} runs it with "
            f"{fresh} fresh seeds{price}; it has {n})")


def _closest(rows: Sequence[Mapping[str, Any]], section: Mapping[str, Any] | None, seed: int, threshold: float,
             probe_steps: int, stop_reason: str) -> dict[str, Any] | None:
    scored = [(r, w) for r in rows if r.get("duplicate_of") is None and r.get("status") == "ok"
              and (w := reward_of(r, section, seed)) is not None]
    if not scored:
        return None
    row, reward = max(scored, key=lambda rw: rw[1].value)
    change = [f"lower the threshold to {math.floor(reward.low * 1000) / 1000:g}, its interval's low end "
              "(--set search.reward_threshold=...), if that reward is good enough",
              f"give the probes more steps to learn (--set probe.steps={2 * probe_steps})"]
    if stop_reason.startswith("budget"):
        change.append("raise --budget-yuan so more of the space is tried")
    else:
        change.append("raise --trials or widen the search space")
    return {"trial": row["number"], "reward": _quoted(reward), "shortfall": threshold - reward.value,
            "change": change}


def decide(rows: Sequence[Mapping[str, Any]], section: Mapping[str, Any] | None, *, threshold: float, seed: int,
           probe_steps: int = 0, stop_reason: str = "", spent_yuan: float = 0.0, waiting: Sequence[str] = (),
           planned: tuple[Sequence[int], int] | None = None, no_round: str | None = None) -> Answer:
    """The answer over a search's trial rows (:func:`tunekit.search.result.row_of`) and its confirmation section;
    ``waiting``: the references no trial has probed yet (:mod:`tunekit.search.references`), said to be so;
    ``planned``: where no round has finished, the trials the confirmation round will probe and its fresh seeds
    (:func:`tunekit.search.confirm.round_configs`, ``search.confirm_seeds``), for what further seeds would cost;
    ``no_round``: where no round will run, why (:func:`tunekit.search.confirm.nothing_to_confirm`).

    The confirmation round's pick when it named one that reaches the threshold (within noise counts), else the
    cheapest priced configuration that reaches it, else the cheapest that reaches it within noise, else none (with
    the closest configuration).
    """
    ans = Answer(threshold=threshold, search_yuan=spent_yuan)
    costs = {r["number"]: c for r in rows if r.get("duplicate_of") is None and (c := cost_of(r, section, seed)) is not None}
    judged = [(r, w, reach(w, threshold)) for r in rows if r["number"] in costs and not r.get("reference")
              and (w := reward_of(r, section, seed)) is not None]
    base = [r for r in rows if r.get("baseline") and r["number"] in costs]
    ans.baseline_cost = _quoted(costs[base[-1]["number"]]) if base else None
    pick = None
    winner = (section or {}).get("winner")
    if winner is not None:
        pick = next(((r, w, v) for r, w, v in judged if r["number"] == winner and v != "infeasible"), None)
    for kind in ("feasible", "within noise"):
        if pick is None:
            pick = min(((r, w, v) for r, w, v in judged if v == kind), key=lambda x: costs[x[0]["number"]].yuan, default=None)
    if pick is None:
        ans.closest = _closest(rows, section, seed, threshold, probe_steps, stop_reason)
        ans.title = (f"No configuration reaches the threshold {threshold:g}" if ans.closest is not None
                     else "No answer: no probe finished with a reward")
        return ans
    row, reward, kind = pick
    ans.trial, ans.verdict, ans.reward = row["number"], kind, _quoted(reward)
    ans.tied = _tied(section, row["number"])
    ans.projected_yuan, ans.cost = costs[row["number"]].yuan, _quoted(costs[row["number"]])
    if kind == "within noise":
        # a further seed probes every configuration of the round once: the round's, else the answer, the baseline
        # and the references (each once, though the answer be the baseline)
        in_round = ({c["trial"] for c in (section or {}).get("configurations", [])} or set(planned[0] if planned else ())
                    or {r["number"] for r in [row, *base[-1:], *(r for r in rows if r.get("reference"))]})
        seed_yuan = sum(float(r.get("probe_yuan") or 0.0) for r in rows
                        if r["number"] in in_round and r.get("duplicate_of") is None)
        ans.settle = settle(reward, threshold, seed_yuan or None, planned=planned[1] if planned else None,
                            no_round=no_round)
        sure = min(((r, w) for r, w, v in judged if v == "feasible"), key=lambda x: costs[x[0]["number"]].yuan, default=None)
        if sure is not None:
            n = sure[0]["number"]
            ans.surely = {"trial": n, "projected_yuan": costs[n].yuan, "cost": _quoted(costs[n]),
                          "reward": _quoted(sure[1]), "side_by_side": _paired(section, row["number"], n)}
    ans.title = f"Cheapest configuration that {WORDING[kind]}: trial {row['number']}"
    ans.against = [compare(row, other, name, section, seed=seed, threshold=threshold)
                   for name, other in _comparators(rows, waiting) if other["number"] != row["number"]]
    return ans


def _comparators(rows: Sequence[Mapping[str, Any]], waiting: Sequence[str]) -> list[tuple[str, Mapping[str, Any]]]:
    """The baseline's trial and each reference's (its latest: a retried one is probed again), by name; a reference
    in ``waiting`` (no trial yet) as a trial not numbered, waiting."""
    named = {("the baseline" if r.get("baseline") else str(r["reference"])): r for r in rows
             if r.get("baseline") or r.get("reference")}
    return [*named.items(), *((name, {"number": None, "status": "waiting", "reference": name})
                              for name in waiting if name not in named)]


def compare(row: Mapping[str, Any], other: Mapping[str, Any], name: str, section: Mapping[str, Any] | None, *,
            seed: int, threshold: float) -> dict[str, Any]:
    """Trial ``row``'s full run against ``other`` (the baseline or a reference called ``name``): the saving in yuan and
    percent, with the interval of the confirmation round's paired cost ratio when the round ran both, else from
    their single probes without an interval; ``other`` not priced when its probe did not end ok or its reward does
    not reach the threshold; ``other`` without a number: a reference not enqueued yet."""
    head = f"against {name}" + (f" (trial {other['number']})" if other["number"] is not None else "")
    out: dict[str, Any] = {"name": name, "trial": other["number"], "reference": bool(other.get("reference")),
                           "priced": False, "ratio": None, "saving_yuan": None, "saving_pct": None, "saving_pct_ci": None,
                           "saving_yuan_ci": None}
    if other.get("status") in ("waiting", "running"):  # a search stopped or read before this probe ended
        return out | {"text": f"{head}: not probed yet ({other['status']}), not priced"}
    if other.get("status") != "ok":
        return out | {"text": f"{head}: its probe ended {other.get('status')} ({other.get('reason') or 'no reason'}), not priced"}
    reward, mine, theirs = reward_of(other, section, seed), cost_of(row, section, seed), cost_of(other, section, seed)
    if reward is None or theirs is None or mine is None or reach(reward, threshold) == "infeasible":
        said = f"reward {reward.text()}" if reward else "no reward"
        return out | {"reaches": False, "text": f"{head}: it does not reach the threshold {threshold:g} within its "
                                                f"probes ({said}), not priced"}
    paired = (((section or {}).get("paired") or {}).get(str(other["number"])) or {}).get(str(row["number"]))
    if paired and mine.confirmed and theirs.confirmed:
        ratio = paired["cost"]
        r, (lo, hi), how = ratio["ratio"], *quoted_interval(ratio)
        pct, pct_ci = 100.0 * (1.0 - r), [100.0 * (1.0 - hi), 100.0 * (1.0 - lo)]
        text = (f"{head}, full run {theirs.text()}: saving {theirs.yuan * (1.0 - r):.4g} yuan, {pct:.1f}% "
                f"[{pct_ci[0]:.1f}%, {pct_ci[1]:.1f}%] (paired cost ratio {r:.3f}x [{lo:.3f}, {hi:.3f}] over "
                f"{len(ratio.get('per_round', []))} rounds, {how})")
        return out | {"priced": True, "reaches": True, "ratio": ratio, "saving_yuan": theirs.yuan * (1.0 - r),
                      "saving_pct": pct, "saving_pct_ci": pct_ci,
                      "saving_yuan_ci": [theirs.yuan * (1.0 - hi), theirs.yuan * (1.0 - lo)], "text": text}
    if split_pair(section, row["number"], other["number"]):
        how = "the confirmation round probed them on different machines"
    elif other.get("reference") and (section or {}).get("references_left_out"):
        mine = cost_of(row, None, seed) or mine  # like with like: the answer's own single probe
        how = (f"single probes {apart(row, other)}, the answer's at {mine.yuan:.4g} yuan: the confirmation round left "
               "the references out (search.confirm_references)")
    else:
        how = f"probes {apart(row, other)}, not side by side in a confirmation round"
    saving = theirs.yuan - mine.yuan
    text = f"{head}, full run {theirs.text()}: saving {saving:.4g} yuan, {100.0 * saving / theirs.yuan:.1f}% ({how}: no interval)"
    return out | {"priced": True, "reaches": True, "saving_yuan": saving, "saving_pct": 100.0 * saving / theirs.yuan,
                  "text": text}


def quoted_interval(ratio: Mapping[str, Any]) -> tuple[tuple[float, float], str]:
    """The interval a paired cost ratio is quoted with, and what it is: how far the rounds' ratios move from round to
    round (Student's t, ``noise_ci``) where two rounds measured it, the wider of it and the bootstrap over the probes'
    steady steps (``ci``), which alone sees none of the load that changes between rounds."""
    boot, noise = ratio["ci"], ratio.get("noise_ci")
    if not noise:
        return (boot[0], boot[1]), "the interval from the probes' steady steps alone"
    return (min(boot[0], noise[0]), max(boot[1], noise[1])), "the interval from how far the rounds' ratios move"


def split_pair(section: Mapping[str, Any] | None, a: int, b: int) -> bool:
    """Whether a round of the confirmation ``section`` probed trials ``a`` and ``b`` on different machines only (a
    round resumed on another machine without a partner probe), so that it does not pair them."""
    return any(str(a) in ms and str(b) in ms and not set(ms[str(a)]) & set(ms[str(b)])
               for ms in (split["machines"] for split in (section or {}).get("split_rounds") or []))


def apart(row: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """How two trials' single probes were run: at different times, and on different machines where both recorded
    theirs (:data:`~tunekit.metrics.MACHINE`) and they differ."""
    mine, theirs = row.get("machine"), other.get("machine")
    where = ", on different machines" if mine and theirs and mine != theirs else ""
    return f"run at different times{where}"


def _paired(section: Mapping[str, Any] | None, trial: int, reference: int) -> dict[str, Any] | None:
    """The confirmation round's paired cost ratio of ``trial`` over ``reference`` when it measured one (a candidate
    against the baseline, or the baseline against a candidate: the candidate's ratio inverted, its intervals with
    it), else None: two probes' projections made at different times are not compared."""
    if not section:
        return None
    vs = section.get("ratios_vs_baseline") or {}
    if section.get("baseline") == reference:
        return (vs.get(str(trial)) or {}).get("cost")
    if section.get("baseline") == trial and (r := (vs.get(str(reference)) or {}).get("cost")):
        return _inverted(r)
    return None


def _inverted(r: Mapping[str, Any]) -> dict[str, Any]:
    """A paired ratio the other way round: one over it, its intervals and each round's with it."""
    def flip(ci: Sequence[float] | None) -> list[float] | None:
        return [1.0 / ci[1], 1.0 / ci[0]] if ci else None

    return {**r, "ratio": 1.0 / r["ratio"], "ci": flip(r["ci"]), "noise_ci": flip(r.get("noise_ci")),
            "per_round": [1.0 / x for x in r.get("per_round", [])]}


def _tied(section: Mapping[str, Any] | None, trial: int) -> dict[str, Any] | None:
    """The configuration the confirmation round named beside ``trial`` (:func:`tunekit.search.confirm.final_verdict`:
    the two it could not tell apart in cost) and ``trial``'s paired cost ratio over it, else None."""
    named = list((section or {}).get("named") or [])
    if trial not in named or len(named) < 2:
        return None
    other = next(n for n in named if n != trial)
    ratio = _paired(section, trial, other)
    top = (section or {}).get("top_two")
    if ratio is None and top and set(top["trials"]) == {trial, other}:  # the first over the second
        ratio = top if top["trials"][0] == trial else _inverted(top)
    return {"trial": other, "ratio": ratio}


def _tied_line(trial: int, tied: Mapping[str, Any]) -> str:
    head = f"the confirmation round could not tell trial {trial}'s cost from trial {tied['trial']}'s"
    ratio = tied.get("ratio")
    if not ratio:
        return head
    (lo, hi), how = quoted_interval(ratio)
    rounds = ", ".join(f"{x:.3g}x" for x in ratio.get("per_round", []))
    return (f"{head}: side by side it costs {ratio['ratio']:.3f}x [{lo:.3f}, {hi:.3f}] of it ({how}"
            + (f"; per round {rounds}" if rounds else "") + ")")


def _none_line(ans: Answer) -> str:
    c = ans.closest
    if c is None:
        return f"no answer: no probe finished with a reward to hold against the threshold {ans.threshold:g}"
    return (f"no configuration reaches the threshold {ans.threshold:g}; the closest is trial {c['trial']}, reward "
            f"{c['reward']['text']}, {c['shortfall']:.3f} short: {'; or '.join(c['change'])}")


HOLDS = "if its reward, within noise of the threshold, holds"
"""How a saving of an answer within noise is said: what it saves if its reward reaches the threshold."""


def _payback_line(ans: Answer) -> str:
    head = f"the search itself cost {ans.search_yuan:.4g} yuan in probes"
    if ans.payback_runs is None:
        return f"{head}; with no saving against the baseline it does not pay for itself"
    held = f", {HOLDS}," if ans.verdict == "within noise" else ""
    return f"{head}; the saving of {ans.saving_yuan:.4g} yuan a run{held} pays for it after {ans.payback_runs} full run(s)"



def so_far(rows: Sequence[Mapping[str, Any]], *, threshold: float, seed: int) -> str | None:
    """The progress bar's best so far, by :func:`decide`'s rule: ``trial 3, 1.2 yuan, reaches the threshold``."""
    return short(decide(rows, None, threshold=threshold, seed=seed).as_dict())


def short(answer: Mapping[str, Any]) -> str | None:
    """An answer (:meth:`Answer.as_dict`) in a few words, for the progress bar; None when nothing reaches the
    threshold."""
    if answer.get("trial") is None:
        return None
    return f"trial {answer['trial']}, {answer['projected_yuan']:.4g} yuan, {WORDING[answer['verdict']]}"


def answers_so_far(rows: Sequence[Mapping[str, Any]], *, threshold: float, seed: int) -> list[float | None]:
    """After each trial row (in trial order), the projected yuan of the answer :func:`decide` gives over the rows up
    to it (no confirmation round); None until one reaches the threshold, within noise included."""
    out = []
    for i in range(len(rows)):
        ans = decide(rows[:i + 1], None, threshold=threshold, seed=seed)
        out.append(ans.projected_yuan if ans.trial is not None else None)
    return out
