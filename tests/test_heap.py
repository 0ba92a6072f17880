"""The heap is frozen after the warm-up steps only: later full collections skip what compilation built."""

from __future__ import annotations

import gc
import weakref

import pytest

from tunekit.config import load_recipe
from tunekit.profiler.startup import StartupClock
from tunekit.trainer.entry import run_steps
from tunekit.trainer.heap import freeze_heap
from tunekit.placement.dist import Dist


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

    def evaluate(self, step: int) -> dict[str, float]:
        return {}  # no held-out prompts


def tracked(nodes: list[Node]) -> list[bool]:
    """Whether each node is still seen by the collector (frozen objects are not: they are in the permanent
    generation). The freeze count itself is no witness: it drops when a frozen object is freed."""
    seen = {id(o) for o in gc.get_objects() if isinstance(o, Node)}
    return [id(n) in seen for n in nodes]


def test_run_steps_freezes_after_each_warmup_step_only() -> None:
    recipe = load_recipe(None, ["probe.steps=5", "probe.warmup_steps=2", "system.device=cpu"])
    trainer = StepCounter()
    run_steps(recipe, trainer, None, Dist(), StartupClock())
    assert trainer.frozen_at_start[0] == 0 and trainer.frozen_at_start[1] > 0
    left = [tracked(kept) for kept in trainer.kept]
    assert not any(left[0] + left[1])  # what the warm-up steps built is frozen
    assert all(left[2] + left[3] + left[4])  # nothing after the timed steps


class FakeRole:
    """Stands in for a built role: each call leaves state behind, as compilation or an engine would."""

    def __init__(self) -> None:
        self.kept: list[list[Node]] = []

    def _call(self, *_, **__):
        self.kept.append([Node() for _ in range(50)])
        return {}

    logprobs = values = score = update = _call

    def generate(self, *args, **kwargs):
        self._call()
        return None, None  # responses and their logprobs, as a rollout role returns them


@pytest.mark.parametrize("role, step_call, other_call", [
    ("ref", "logprobs", None), ("rollout", "generate", None), ("reward", "score", None),
    ("actor", "update", "logprobs"),  # the actor's old-logprob pass is not its step call
])
def test_role_workers_freeze_after_their_warmup_step_calls(role, step_call, other_call) -> None:
    from tunekit.trainer.workers import RoleWorker

    recipe = load_recipe(None, ["probe.warmup_steps=2", "system.device=cpu"])
    worker = RoleWorker(recipe.model_dump(), role, rank=0, world=1, device_index=0, threads=1)
    worker.role = FakeRole()
    args = {"update": ((None,), {"mini_batch": 1, "seed": 0}), "logprobs": ((None,), {}),
            "generate": ((None,), {"seed": 0}), "score": (([], []), {})}
    calls = [other_call, step_call] if other_call else [step_call]
    for _ in range(4):  # four steps
        for name in calls:
            getattr(worker, name)(*args[name][0], **args[name][1])
    per_step = [sum(worker.role.kept[i:i + len(calls)], []) for i in range(0, len(worker.role.kept), len(calls))]
    left = [tracked(nodes) for nodes in per_step]
    assert not any(left[0] + left[1])  # frozen after the two warm-up steps' calls
    assert all(left[2] + left[3])  # and never after
