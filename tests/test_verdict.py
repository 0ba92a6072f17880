"""The search's verdict as pure functions: reward intervals, feasible / within noise / infeasible, paired cost
ratios and the confirmation round's final word."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tunekit.search.confirm import final_verdict
from tunekit.search.verdict import Interval, Measured, paired_ratio, reward_interval, verdict


def test_reward_interval_brackets_the_window_mean_and_narrows_with_steps() -> None:
    window = [0.3, 0.5, 0.4, 0.6, 0.2]
    r = reward_interval([window])
    assert r.value == pytest.approx(0.4)
    assert r.low < 0.4 < r.high and 0.2 <= r.low and r.high <= 0.6
    longer = reward_interval([window * 8])  # the same spread over 8x the steps: about 1/sqrt(8) the width
    assert longer.value == pytest.approx(0.4)
    assert (longer.high - longer.low) < 0.5 * (r.high - r.low)
    assert reward_interval([[0.5, 0.5, 0.5]]) == Interval(0.5, 0.5, 0.5)  # no spread, no width
    # seeds: each seed's mean counts once, whatever its window length
    assert reward_interval([[0.2, 0.2], [0.6, 0.6, 0.6, 0.6]]).value == pytest.approx(0.4)
    with pytest.raises(ValueError):
        reward_interval([[]])


@pytest.mark.parametrize(("interval", "expected"), [
    (Interval(0.45, 0.41, 0.49), "feasible"),
    (Interval(0.42, 0.40, 0.44), "feasible"),   # the low end on the threshold counts as reaching it
    (Interval(0.41, 0.38, 0.44), "within noise"),
    (Interval(0.39, 0.36, 0.42), "within noise"),
    (Interval(0.35, 0.33, 0.39), "infeasible"),
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


def _cfg(verdict_: str) -> dict:
    return {"verdict": verdict_}


def _ratio(probes: list[tuple[Measured, Measured]]) -> dict:
    return {"cost": paired_ratio(probes).as_dict()}


def test_final_verdict_confirms_only_a_saving_clear_of_noise() -> None:
    base, c1, c2 = (SimpleNamespace(number=n) for n in (0, 3, 5))
    fast, slow = _probe(1.0, jitter=0.05), _probe(2.0, jitter=0.05)
    measured = {(0, 0): slow, (3, 0): fast, (5, 0): _probe(1.9, jitter=0.05)}
    per = {0: _cfg("feasible"), 3: _cfg("feasible"), 5: _cfg("feasible")}
    ratios = {3: _ratio([(fast, slow)] * 2), 5: _ratio([(measured[(5, 0)], slow)] * 2)}
    out = final_verdict(per, ratios, [c1, c2], base, measured, None)
    assert out["verdict"] == "confirmed" and out["winner"] == 3 and not out["top_two"]["within_noise"]
    # the same saving seen in one round only is not confirmed: the order of the probes may have made it
    one = final_verdict(per, {3: _ratio([(fast, slow)]), 5: _ratio([(measured[(5, 0)], slow)])}, [c1, c2], base, measured, None)
    assert one["verdict"] == "within noise" and one["winner"] == 3 and "one round" in one["sentence"]
    # two rounds that disagree (the baseline's fixed cost was high in the first only): not confirmed either
    heavy = Measured(fixed_s=400.0, steady_s=slow.steady_s, rest_steps=100, gpus=1)
    split = final_verdict(per, {3: _ratio([(fast, heavy), (fast, _probe(0.9, jitter=0.05))])}, [c1], base,
                          {(0, 0): heavy, (3, 0): fast}, None)
    assert split["verdict"] == "within noise" and "not in every round" in split["sentence"]
    # the same saving with a reward within noise of the threshold over all seeds is not a plain win
    out = final_verdict(per | {3: _cfg("within noise")}, ratios, [c1, c2], base, measured, None)
    assert out["verdict"] == "within noise" and out["winner"] == 3
    # two candidates as fast as each other: said to be within noise of each other
    twin = _probe(1.0, jitter=0.3)
    noisy = {(0, 0): slow, (3, 0): _probe(1.0, jitter=0.3), (5, 0): twin}
    out = final_verdict(per, {3: _ratio([(noisy[(3, 0)], slow)]), 5: _ratio([(twin, slow)])}, [c1, c2], base, noisy, None)
    assert out["verdict"] == "within noise" and out["top_two"]["within_noise"] and "trials 3 and 5" in out["sentence"]
    # a candidate slower than the baseline side by side: the baseline is the answer
    out = final_verdict(per, {3: _ratio([(slow, fast)])}, [c1], base, {(0, 0): fast, (3, 0): slow}, None)
    assert out["verdict"] == "baseline" and out["winner"] == 0
    # nothing left to pair with
    out = final_verdict(per, {3: None}, [c1], base, {}, "cut short by the budget")
    assert out["verdict"] == "unconfirmed" and out["winner"] is None and "budget" in out["sentence"]
