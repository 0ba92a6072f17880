"""The heap is frozen after the warm-up steps only: later full collections skip what compilation built."""

from __future__ import annotations

import gc
import weakref

import pytest

from tunekit.config import load_recipe
from tunekit.trainer.entry import run_steps
from tunekit.trainer.heap import freeze_heap
from tunekit.trainer.parallel import Dist


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    pass


def test_freeze_collects_garbage_and_freezes_what_lives() -> None:
    garbage = Node()
    garbage.self = garbage  # a cycle: only the collector frees it
    dead = weakref.ref(garbage)
    del garbage
    alive = Node()
    assert freeze_heap() > 0
    assert dead() is None
    assert all(o is not alive for o in gc.get_objects())  # in the permanent generation, which collections skip


class StepCounter:
    """Records how many objects were frozen when each step began."""

    def __init__(self) -> None:
        self.frozen_at_start: list[int] = []
        self.kept: list[list[Node]] = []

    def step(self, step: int) -> dict[str, float]:
        self.frozen_at_start.append(gc.get_freeze_count())
        self.kept.append([Node() for _ in range(50)])  # state a step leaves behind (graphs, caches)
        return {"step": step, "timing_s/step": 0.01}


def test_run_steps_freezes_after_each_warmup_step_only() -> None:
    recipe = load_recipe(None, ["probe.steps=5", "probe.warmup_steps=2", "system.device=cpu"])
    trainer = StepCounter()
    run_steps(recipe, trainer, None, Dist(), t0=0.0)
    first, second, third, fourth, fifth = trainer.frozen_at_start
    assert first == 0
    assert second > 0 and third > second  # frozen after steps 0 and 1
    assert fourth == third and fifth == third  # not after the steps that are timed
