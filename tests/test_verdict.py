"""The search's verdict as pure functions: reward intervals, feasible / within noise / infeasible, paired cost
ratios and the confirmation round's final word."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tunekit.search.confirm import final_verdict
from tunekit.search.verdict import (Interval, Measured, Spread, compare, held_out_interval, paired_ratio, reward_interval,
                                    round_spread, t975, verdict)


def test_reward_interval_brackets_the_window_mean_and_narrows_with_steps() -> None:
    window = [0.3, 0.5, 0.4, 0.6, 0.2]
    r = reward_interval([window])
    assert r.value == pytest.approx(0.4)
    assert r.low < 0.4 < r.high
    longer = reward_interval([window * 8])  # the same spread over 8x the steps: about 1/sqrt(8) the width
    assert longer.value == pytest.approx(0.4)
    assert (longer.high - longer.low) < 0.5 * (r.high - r.low)
    assert reward_interval([[0.5, 0.5, 0.5]]) == Interval(0.5, 0.5, 0.5)  # no spread, no width
    # seeds: each seed's mean counts once, whatever its window length
    assert reward_interval([[0.2, 0.2], [0.6, 0.6, 0.6, 0.6]]).value == pytest.approx(0.4)
    with pytest.raises(ValueError):
        reward_interval([[]])


def test_the_reward_interval_covers_the_true_level_as_often_as_it_claims() -> None:
    """Windows of 5, 10 and 20 steps drawn around 0.5 (sd 0.1): the 95% interval holds 0.5 in 95% of them. A
    percentile bootstrap of so few steps held it in 85%, 90% and 93%, and so called trials feasible too easily."""
    import numpy as np

    rng = np.random.default_rng(3)
    for n in (5, 10, 20):
        held = [reward_interval([rng.normal(0.5, 0.1, n)]).contains(0.5) for _ in range(2000)]
        assert 0.935 <= sum(held) / len(held) <= 0.965, (n, sum(held) / len(held))
    # three seeds that differ only by their windows' noise: that noise is not counted twice (it gave 98.7%)
    held = [reward_interval([rng.normal(0.5, 0.1, 10) for _ in range(3)]).contains(0.5) for _ in range(2000)]
    assert 0.935 <= sum(held) / len(held) <= 0.98, sum(held) / len(held)
    # one window by hand: 0.3, 0.5, 0.4, 0.6, 0.2 has sd 0.1581, so the mean 0.4 is +-2.776 x 0.1581 / sqrt 5
    r = reward_interval([[0.3, 0.5, 0.4, 0.6, 0.2]])
    assert (r.low, r.high) == (pytest.approx(0.4 - 0.19630, abs=1e-4), pytest.approx(0.4 + 0.19630, abs=1e-4))
    # inside the reward's range: a mean near 0 of rewards in [0, 1] is never read below 0
    low = reward_interval([[0.0, 0.1, 0.0, 0.0, 0.05]], (0.0, 1.0))
    assert low.low == 0.0 and low.high > 0.03


def test_seeds_that_disagree_widen_the_interval_by_their_spread() -> None:
    # two seeds that each sit still but apart: no noise inside the windows, all of it between the seeds; the
    # standard error of their means is 0.1 (sd 0.1414 over sqrt 2), and two seeds say little of their spread: each
    # side is Student's t on one degree of freedom, 12.706, times 0.1 from the mean
    apart = reward_interval([[0.5] * 5, [0.3] * 5])
    assert apart.value == pytest.approx(0.4)
    assert (apart.low, apart.high) == (pytest.approx(0.4 - 1.2706, abs=1e-4), pytest.approx(0.4 + 1.2706, abs=1e-4))
    # kept inside the reward's range where the reward lies in it; a reward outside its stated range is left as it is
    assert reward_interval([[0.5] * 5, [0.3] * 5], (0.0, 1.0)) == Interval(pytest.approx(0.4), 0.0, 1.0)
    scored = reward_interval([[-2.0, -2.2, -1.9, -2.4, -2.1]], (0.0, 1.0))
    assert scored.low <= scored.value <= scored.high
    # three seeds whose means straddle a threshold of 0.42 (0.472, 0.412, 0.438), each steady in its window: the
    # seeds' spread, not the windows', decides, and one seed below the threshold leaves the verdict within noise
    seeds = [[m - 0.01, m + 0.01] * 5 for m in (0.472, 0.412, 0.438)]
    r = reward_interval(seeds)
    assert verdict(r, 0.42) == "within noise" and r.low < 0.412 < 0.472 < r.high
    # seeds that agree stay as narrow as their windows make them
    same = reward_interval([[0.44, 0.45, 0.43, 0.46, 0.42]] * 3)
    assert same.high - same.low < 0.03


@pytest.mark.parametrize(("interval", "expected"), [
    (Interval(0.45, 0.41, 0.49), "feasible"),
    (Interval(0.42, 0.40, 0.44), "feasible"),   # the low end on the threshold counts as reaching it
    (Interval(0.41, 0.38, 0.44), "within noise"),
    (Interval(0.39, 0.36, 0.42), "within noise"),
    (Interval(0.35, 0.33, 0.39), "infeasible"),
    (Interval(0.38, 0.36, 0.40), "within noise"),  # the high end on the threshold: it may reach it
])
def test_verdict_reads_the_whole_interval(interval: Interval, expected: str) -> None:
    assert verdict(interval, 0.40) == expected


def _probe(step_s: float, *, jitter: float = 0.0, fixed_s: float = 10.0, rest: int = 100, gpus: int = 1) -> Measured:
    return Measured(fixed_s=fixed_s, steady_s=[step_s - jitter, step_s, step_s + jitter] * 3, rest_steps=rest, gpus=gpus)


def test_paired_ratio_is_the_geometric_mean_of_rounds_with_an_interval() -> None:
    # candidate: 10 s fixed + 100 x 1 s on 1 GPU = 110; baseline: 10 + 100 x 2 s = 210
    steady = paired_ratio([(_probe(1.0), _probe(2.0))])
    assert steady.value == pytest.approx(110 / 210) and steady.low == pytest.approx(steady.high)
    # two GPUs held pay twice: 2 x 110 vs 210
    assert paired_ratio([(_probe(1.0, gpus=2), _probe(2.0))]).value == pytest.approx(220 / 210)
    # a loaded machine in round 2 slows both sides; the paired ratio of each round is what counts
    rounds = [(_probe(1.0, jitter=0.2), _probe(2.0, jitter=0.2)), (_probe(3.0, jitter=0.2), _probe(6.0, jitter=0.2))]
    r = paired_ratio(rounds)
    per = [(10 + 100 * 1.0) / (10 + 100 * 2.0), (10 + 100 * 3.0) / (10 + 100 * 6.0)]
    assert r.per_round == pytest.approx(per)
    assert r.value == pytest.approx((per[0] * per[1]) ** 0.5)
    assert r.low < r.value < r.high < 1.0


def _cfg(verdict_: str, sets: list[str] | None = None) -> dict:
    return {"verdict": verdict_, "sets": sets or []}


def test_t_quantile_table_takes_the_wider_value_between_entries() -> None:
    assert t975(1) == 12.706 and t975(6) == 2.447
    assert t975(11) == t975(10) == 2.228  # between 10 and 12: the smaller df's, wider
    assert t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_round_spread_pools_log_ratios_about_each_pairs_mean() -> None:
    # pair 1: 0.8, 0.88, 0.968 over three rounds (10% apart each); pair 2: 0.5, 0.55; pair 3 one round, left out.
    # l = ln 1.1 = 0.0953102; squares about the means: 2 l^2 + l^2 / 2 = 2.5 l^2 over 2 + 1 = 3 df
    # sd = l x sqrt(2.5 / 3) = 0.0953102 x 0.912871 = 0.0870060
    s = round_spread([[0.8, 0.88, 0.968], [0.5, 0.55], [0.3]])
    assert s is not None and s.df == 3 and s.sd == pytest.approx(0.0870060, abs=1e-6)
    assert round_spread([[0.9], [0.7]]) is None
    assert round_spread([[0.5, 0.5]]) == Spread(0.0, 1)  # the same ratio in both rounds: no spread


def _flat(step_s: float, *, rest: int = 100) -> Measured:
    """A probe with no fixed cost and one steady step time: its run costs rest x step_s GPU-seconds, no interval."""
    return Measured(fixed_s=0.0, steady_s=[step_s] * 5, rest_steps=rest, gpus=1)


def test_compare_tells_apart_only_beyond_the_probes_own_spread() -> None:
    rounds = [(_flat(0.97), _flat(1.0)), (_flat(0.98), _flat(1.0))]
    # ratio = sqrt(0.97 x 0.98) = 0.974987; half-width t(6) x sd / sqrt(2 rounds) = 2.447 x 0.05 / 1.414214 = 0.086515
    # noise interval 0.974987 x exp(-+0.086515) = [0.8942, 1.0631]: holds 1, within noise
    wide = compare(rounds, Spread(0.05, 6))
    assert wide.ratio.value == pytest.approx(0.974987, abs=1e-6)
    assert wide.noise == pytest.approx((0.8942, 1.0631), abs=1e-4)
    assert not wide.apart and "round to round" in wide.why
    # a machine ten times quieter: 0.0086515, [0.9666, 0.9835], apart
    quiet = compare(rounds, Spread(0.005, 6))
    assert quiet.noise == pytest.approx((0.9666, 0.9835), abs=1e-4) and quiet.apart and quiet.why == ""
    # rounds that disagree, one round, or no spread measured: never apart, whatever the spread
    split = compare([(_flat(0.5), _flat(1.0)), (_flat(1.1), _flat(1.0))], Spread(0.001, 6))
    assert not split.apart and "every round" in split.why
    assert not compare(rounds[:1], Spread(0.001, 6)).apart
    assert not compare(rounds, None).apart
    # the bootstrap interval over steady steps holding 1 keeps them together too
    jitter = [(Measured(0.0, [0.4, 1.4] * 3, 100, 1), _flat(1.0))] * 2  # 0.9x in both rounds, steps of 0.4 or 1.4 s
    assert not compare(jitter, Spread(0.001, 6)).apart and "paired interval" in compare(jitter, Spread(0.001, 6)).why


def _ratio(probes: list[tuple[Measured, Measured]], spread: Spread = Spread(0.05, 6)) -> dict:
    return {"cost": compare(probes, spread).as_dict()}


def _case(spread: Spread, *, c3: float, c5: float, base: float = 2.0, v3: str = "feasible"):
    """Baseline (trial 0) and candidates 3 and 5, two rounds each, steady step times as given; trial 5 changes one knob
    from the baseline, trial 3 two."""
    b, p3, p5 = _flat(base), _flat(c3), _flat(c5)
    measured = {(n, r): m for r in (0, 1) for n, m in ((0, b), (3, p3), (5, p5))}
    per = {0: _cfg("feasible", ["a=1", "b=1"]), 3: _cfg(v3, ["a=2", "b=2"]), 5: _cfg("feasible", ["a=2", "b=1"])}
    ratios = {n: _ratio([(measured[(n, r)], b) for r in (0, 1)], spread) for n in (3, 5)}
    cands = [SimpleNamespace(number=3), SimpleNamespace(number=5)]
    return final_verdict(per, ratios, cands, SimpleNamespace(number=0), measured, spread, None)


def test_final_verdict_names_both_of_a_top_two_the_round_cannot_separate() -> None:
    # 3 over 5: 1.0 / 1.02 = 0.980392, noise interval 0.980392 x exp(-+2.447 x 0.05 / sqrt 2) = [0.8991, 1.0690]: within noise;
    # both against the baseline: 0.50 and 0.51, far outside the spread; a saving of the smaller one, 1 - 0.51
    out = _case(Spread(0.05, 6), c3=1.0, c5=1.02)
    assert out["verdict"] == "within noise" and out["named"] == [3, 5]
    assert out["final_verdict"] == "top two within noise: trials 3 and 5"
    assert out["top_two"]["within_noise"] and out["top_two"]["ratio"] == pytest.approx(0.980392, abs=1e-6)
    assert out["top_two"]["noise_ci"] == pytest.approx([0.8991, 1.0690], abs=1e-4)
    assert out["winner"] == 5  # one knob changed from the baseline, not the cheaper point estimate
    assert out["saving_ratio"] == pytest.approx(0.51)
    assert out["sentence"].startswith(out["final_verdict"])
    # the same pair on a quiet machine (sd 0.5%): 0.980392 x exp(-+0.0086515) = [0.9719, 0.9889]: apart, 3 confirmed
    out = _case(Spread(0.005, 6), c3=1.0, c5=1.02)
    assert out["verdict"] == "confirmed" and out["named"] == [3] and out["winner"] == 3
    assert out["final_verdict"] == "confirmed: trial 3" and out["saving_ratio"] == pytest.approx(0.50)
    assert not out["top_two"]["within_noise"]
    # the order of the point estimates swaps: the named pair and the run one stay the same
    flipped = _case(Spread(0.05, 6), c3=1.02, c5=1.0)
    assert flipped["named"] == [5, 3] and flipped["winner"] == 5


def test_final_verdict_against_the_baseline() -> None:
    # 1.9 / 2.0 = 0.95 in both rounds, noise [0.95 x exp(-0.086515), 0.95 x exp(0.086515)] = [0.8713, 1.0358]: within noise
    # of the baseline; the answer names both and runs the baseline, which changes nothing
    out = _case(Spread(0.05, 6), c3=1.9, c5=1.95)
    assert out["verdict"] == "within noise" and out["named"] == [3, 0] and out["winner"] == 0
    assert out["saving_ratio"] is None and "trial 3 and the baseline, trial 0" in out["final_verdict"]
    # both candidates twice the baseline's step: no saving, the baseline
    out = _case(Spread(0.05, 6), c3=4.0, c5=4.2)
    assert out["verdict"] == "baseline" and out["winner"] == 0 and out["saving_ratio"] is None
    # a clear saving whose reward is within noise of the threshold over all seeds: not confirmed, no saving quoted
    out = _case(Spread(0.005, 6), c3=1.0, c5=1.5, v3="within noise")
    assert out["verdict"] == "within noise" and out["named"] == [3] and out["saving_ratio"] is None
    # nothing left to pair with
    out = final_verdict({0: _cfg("feasible"), 3: _cfg("feasible")}, {3: None}, [SimpleNamespace(number=3)],
                        SimpleNamespace(number=0), {}, None, "cut short by the budget")
    assert out["verdict"] == "unconfirmed" and out["winner"] is None and "budget" in out["sentence"]


def test_a_saving_seen_in_one_round_or_not_in_every_round_is_not_confirmed() -> None:
    base, c1 = SimpleNamespace(number=0), SimpleNamespace(number=3)
    per = {0: _cfg("feasible"), 3: _cfg("feasible")}
    fast, slow = _flat(1.0), _flat(2.0)
    one = final_verdict(per, {3: _ratio([(fast, slow)], Spread(0.001, 6))}, [c1], base, {(0, 0): slow, (3, 0): fast},
                        Spread(0.001, 6), None)
    assert one["verdict"] == "within noise" and "one round" in one["sentence"]
    # the baseline's fixed cost was high in the first round only: cheaper in one round, dearer in the other
    heavy = Measured(fixed_s=400.0, steady_s=slow.steady_s, rest_steps=100, gpus=1)
    split = final_verdict(per, {3: _ratio([(fast, heavy), (fast, _flat(0.9))], Spread(0.001, 6))}, [c1], base,
                          {(0, 0): heavy, (3, 0): fast}, Spread(0.001, 6), None)
    assert split["verdict"] == "within noise" and "every round" in split["sentence"]


def test_a_round_with_no_candidate_but_the_baseline_says_so():
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from tunekit.search import confirm

    def trial(value, verdict, baseline=False):
        return create_trial(state=TrialState.COMPLETE, value=value, params={"x": 1},
                            distributions={"x": CategoricalDistribution([1])},
                            user_attrs={"verdict": verdict, "baseline": baseline, "status": "ok"})

    only_base = [trial(2.2, "feasible", baseline=True), trial(4.2, "infeasible"), trial(4.8, "infeasible")]
    assert "nothing to confirm" in confirm.nothing_to_confirm(only_base, 2)
    assert confirm.nothing_to_confirm(only_base, 0).startswith("no confirmation round: search.confirm_top is 0 (")
    with_one = only_base + [trial(3.0, "within noise")]
    assert confirm.nothing_to_confirm(with_one, 2) is None
    assert [t.value for t in confirm.candidates(with_one, 2)] == [3.0]


def test_a_held_out_mean_has_the_interval_its_prompts_allow_not_the_zero_width_of_repeated_steps():
    """36 of 48 held-out prompts right: Wilson's 95% interval for 36/48 is [0.6122, 0.8508]; repeating the
    evaluation in a window narrows nothing; all 48 right still leaves room below 1 (48/51.84 = 0.926)."""
    one = held_out_interval([[0.75]], 48, (0.0, 1.0))
    assert one.value == 0.75 and (one.low, one.high) == pytest.approx((0.61216, 0.85079), abs=1e-5)
    assert held_out_interval([[0.75, 0.75, 0.75]], 48, (0.0, 1.0)) == one
    assert held_out_interval([[1.0]], 48, (0.0, 1.0)).low == pytest.approx(0.92590, abs=1e-5)
    # two seeds on the same 40 prompts rest on 40 prompts: 30 of 40 gives Wilson's [0.5981, 0.8581]; at 0.75 both, no
    # wider; at 0.7 and 0.8 their spread (sd of the mean 0.05, times Student's t on one degree of freedom, 12.706)
    # widens each side in quadrature: 0.75 - hypot(0.15194, 0.6353), and above, past 1, the range's end
    same = held_out_interval([[0.75], [0.75]], 40, (0.0, 1.0))
    assert (same.value, same.low, same.high) == pytest.approx((0.75, 0.59806, 0.85813), abs=1e-5)
    two = held_out_interval([[0.7], [0.8]], 40, (0.0, 1.0))
    assert two.value == pytest.approx(0.75) and (two.low, two.high) == pytest.approx((0.09678, 1.0), abs=1e-5)
    # a reward on [-1, 1] scales onto its range: 0.5 there is 0.75 of the way, as above
    scaled = held_out_interval([[0.5]], 48, (-1.0, 1.0))
    assert (scaled.low, scaled.high) == pytest.approx((2 * 0.61216 - 1, 2 * 0.85079 - 1), abs=1e-4)
    with pytest.raises(ValueError):
        held_out_interval([[]], 48, (0.0, 1.0))


def test_the_held_out_interval_covers_the_true_rate_about_as_often_as_it_says():
    """Held-out sets of 40 prompts drawn from a model that answers 70% right: the 95% interval of each set's mean
    holds 0.7 close to 95% of the time (the bound is exact for right-or-wrong rewards)."""
    import numpy as np

    rng = np.random.default_rng(0)
    means = rng.binomial(40, 0.7, size=4000) / 40
    covered = [held_out_interval([[m]], 40, (0.0, 1.0)).contains(0.7) for m in means]
    assert 0.92 <= sum(covered) / len(covered) <= 0.98
