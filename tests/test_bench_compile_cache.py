"""benchmarks/compile_cache.py: its probes compile their training where the runner can, and a runner that never
compiles (verl's FSDP engine, which refuses ``system.compile=true``) keeps the recipe's own setting."""

from __future__ import annotations

import sys
from pathlib import Path

from tunekit.config import load_recipe
from tunekit.runners import runner_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import compile_cache  # noqa: E402


def test_probes_compile_where_the_runner_can_and_a_user_set_comes_last():
    sets = compile_cache.probe_sets(None, 4, ["system.batch.micro_batch_size=4"])
    assert sets[0] == compile_cache.COMPILED and "probe.steps=4" in sets and sets[-1] == "system.batch.micro_batch_size=4"
    assert load_recipe(None, sets).system.compile is True
    # the user's own setting still wins: it comes after
    assert load_recipe(None, compile_cache.probe_sets(None, 4, ["system.compile=false"])).system.compile is False


def test_a_verl_probe_keeps_the_recipes_compile_setting_which_verl_accepts():
    sets = compile_cache.probe_sets(None, 3, ["runner=verl", "system.controller=single"])
    assert compile_cache.COMPILED not in sets
    recipe = load_recipe(None, sets)
    assert recipe.system.compile != True  # noqa: E712  (auto or false: what verl's runner takes)
    assert runner_for(recipe).training_path(recipe, gpu=True)["resolved/compile"] is False
