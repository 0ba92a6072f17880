"""Pruning a probe on cost: the bar it is held against (the best feasible trial, or a trial of its own learning
within noise of the threshold) and the run length it is projected over."""

from __future__ import annotations

import json

import pytest
from optuna.trial import TrialState, create_trial

from tunekit import metrics
from tunekit.config import load_recipe
from tunekit.estimate.profiles import load_profile
from tunekit.rundir import STEPS_LIVE
from tunekit.search.budget import PruneBar, prune_bar
from tunekit.search.measure import learning_key
from tunekit.search.objective import PRUNE_FACTOR, _CostPrune, _CostWatch


def _done(number: int, value: float, verdict: str, key: str, steps: int | None = 42):
    t = create_trial(state=TrialState.COMPLETE, value=value, user_attrs={
        "status": "ok", "verdict": verdict, "learning_key": key, "projected_steps": steps})
    t.number = number
    return t


def test_a_trial_of_the_same_learning_within_noise_is_a_bar_and_lends_its_run_length():
    trials = [_done(0, 1.8, "within noise", "a"), _done(4, 0.985, "within noise", "a"),
              _done(6, 0.5, "within noise", "b"), _done(7, 2.0, "feasible", "b", steps=30),
              _done(8, 0.2, "infeasible", "a", steps=None)]
    assert prune_bar(trials, "a") == PruneBar(0.985, 4, 42)
    # another learning: only the feasible trial is a bar, and its run length is not lent
    assert prune_bar(trials, "c") == PruneBar(2.0, 7, None)
    assert prune_bar(trials[:3], "c") is None  # within noise of another learning: no bar at all
    # a feasible trial cheaper than the same learning's bar wins
    assert prune_bar([*trials, _done(9, 0.7, "feasible", "b")], "a") == PruneBar(0.7, 9, None)


def _running_probe(tmp_path, step_s: float, steps: int):
    recipe = load_recipe("tiny-grpo", ["probe.steps=50", "search.reward_threshold=0.7", "run.until=threshold"])
    rows = [{metrics.TIMING_STEP: step_s, metrics.REWARD_MEAN: 0.2} for _ in range(steps)]
    (tmp_path / STEPS_LIVE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return recipe


def test_a_probe_of_a_cheaper_trials_learning_is_pruned_over_that_trials_run_length(tmp_path):
    """13 s steps (the SmolLM2 search's TRL trial at micro-batch 8) against a trial of the same learning priced at
    0.985 yuan over 42 steps: over that run length the probe cannot come within 3x, and it is stopped after its
    first steady steps; held to its steps so far plus one, it would run on."""
    recipe = _running_probe(tmp_path, 13.0, 6)
    n = recipe.probe.warmup_steps + 3
    h200 = load_profile("h200")
    with pytest.raises(_CostPrune) as stop:
        _CostWatch(recipe, tmp_path, h200, PruneBar(0.985, 4, 42), lambda e: None)(n)
    assert stop.value.projected > PRUNE_FACTOR * 0.985 and "trial 4" in stop.value.bar.says()
    _CostWatch(recipe, tmp_path, h200, PruneBar(0.985, 4, None), lambda e: None)(n)  # no run length lent: runs on
    _CostWatch(recipe, tmp_path, h200, None, lambda e: None)(n)  # no bar: never pruned


def test_a_probe_as_fast_as_its_learnings_bar_runs_on(tmp_path):
    recipe = _running_probe(tmp_path, 1.5, 6)
    _CostWatch(recipe, tmp_path, load_profile("h200"), PruneBar(0.985, 4, 42), lambda e: None)(
        recipe.probe.warmup_steps + 3)


def test_the_learning_key_ignores_systems_knobs_so_a_systems_variant_shares_the_bar():
    base = load_recipe("tiny-grpo")
    variant = load_recipe("tiny-grpo", ["system.batch.micro_batch_size=8", "runner=trl"])
    other_seed = load_recipe("tiny-grpo", ["probe.seed=1"])
    assert learning_key(variant) == learning_key(base) != learning_key(other_seed)


def test_a_learning_key_added_at_its_default_leaves_the_digest_as_it_was(monkeypatch):
    """A study resumed under a tunekit with one more learning key (at its default) still finds its trials' learning;
    the key set off its default is a new learning."""
    from tunekit.search import measure

    base = load_recipe("tiny-grpo")
    before = learning_key(base)
    real_runs, real_effect = measure.what_runs, measure.effect_of
    added = {"value": 7}
    monkeypatch.setattr(measure, "what_runs", lambda r: real_runs(r) | {"task.new_knob": added["value"]})
    monkeypatch.setattr(measure, "effect_of", lambda k: "learning" if k == "task.new_knob" else real_effect(k))
    measure._learning_defaults.cache_clear()
    try:
        assert learning_key(base) == before
        added["value"] = 8  # the recipe sets it off its default (the defaults were read at 7)
        assert learning_key(base) != before
    finally:
        measure._learning_defaults.cache_clear()


def test_a_trial_is_matched_by_the_learning_its_recorded_recipe_has_today_not_the_key_it_stored(tmp_path):
    """A study resumed under a later version: its earlier trials stored keys by the older rule. Their probes'
    recorded recipes are read again, so a new probe of the same learning still finds them."""
    from tunekit.rundir import write_config

    recipe = load_recipe("tiny-grpo")
    run = tmp_path / "run-t4"
    run.mkdir()
    write_config(run, recipe)
    stale = _done(4, 0.985, "within noise", "key-by-an-older-rule")
    stale.user_attrs["run_dir"] = str(run)
    assert prune_bar([stale], learning_key(recipe)) == PruneBar(0.985, 4, 42)
    gone = _done(5, 0.9, "within noise", "key-by-an-older-rule")
    gone.user_attrs["run_dir"] = str(tmp_path / "removed")  # no recipe to read: the stored key decides
    assert prune_bar([gone], learning_key(recipe)) is None
    assert prune_bar([gone], "key-by-an-older-rule") == PruneBar(0.9, 5, 42)
