"""What lets several search workers share one study: the admission lock, the budget holds of running probes,
and a configuration taken by a running trial in another worker. No probe runs here."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from tunekit.config import load_recipe
from tunekit.search import space
from tunekit.search.budget import RESERVED_ATTR, RUNNING_ATTR, held
from tunekit.search.lock import StudyLock
from tunekit.search.objective import Objective
from tunekit.search.setup import make_setup
from tunekit.search.storage import open_storage


def _running(number: int, estimate: float, spend: float | None = None) -> optuna.trial.FrozenTrial:
    attrs = {RESERVED_ATTR: estimate} | ({RUNNING_ATTR: spend} if spend is not None else {})
    t = create_trial(state=TrialState.RUNNING, user_attrs=attrs)
    t.number = number
    return t


def test_earlier_probes_come_first_when_running_probes_pass_their_estimates():
    done = create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs={RESERVED_ATTR: 9.0})
    done.number = 0
    trials = [done, _running(1, estimate=2.0, spend=5.0), _running(2, estimate=3.0, spend=7.0), _running(3, estimate=4.0)]
    # a trial yet to be admitted counts every running probe at the larger of its estimate and its spend
    assert held(trials) == 5.0 + 7.0 + 4.0
    # trial 2 counts the earlier trial 1 at its spend, the later trial 3 at its estimate, not itself
    assert held(trials, by=2) == 5.0 + 4.0
    # trial 1 counts the later trial 2 at its estimate only: trial 2 is the one to yield
    assert held(trials, by=1) == 3.0 + 4.0


def test_the_admission_lock_lets_one_worker_in_at_a_time(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=storage)
    first, second = StudyLock(open_storage(storage, must_exist=True), "s"), StudyLock(open_storage(storage, must_exist=True), "s")
    entered = threading.Event()

    def other_worker():
        second.acquire()
        entered.set()
        second.release()

    first.acquire()
    t = threading.Thread(target=other_worker)
    t.start()
    assert not entered.wait(0.5)  # blocked while the first holds it
    first.release()
    assert entered.wait(5)
    t.join()


def test_a_configuration_another_worker_is_probing_waits_for_its_result(tmp_path):
    recipe = load_recipe("tiny-ppo")
    setup = make_setup(recipe, 5.0, 4, tmp_path, None, "tiny-ppo")
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}")
    # another worker's admitted trial, probing
    busy = study.ask()
    params = space.suggest(busy, setup.base.search.space, setup.base_raw)
    busy.set_user_attr(RESERVED_ATTR, 1.0)
    # this worker's sampler proposes the same configuration
    study.enqueue_trial(params)
    mine = study.ask()
    objective = Objective(setup, study, lambda _e: None)
    run = objective._admit(mine)
    assert RESERVED_ATTR not in study.trials[mine.number].user_attrs  # no hold: it will not probe

    def finish_busy():
        time.sleep(1.0)
        busy.set_user_attr("status", "ok")
        study.tell(busy, 2.5)

    threading.Thread(target=finish_busy).start()
    t0 = time.monotonic()
    assert run() == 2.5  # the other probe's result, once it ended
    assert time.monotonic() - t0 >= 0.9
    assert study.trials[mine.number].user_attrs["duplicate_of"] == busy.number
    assert study.trials[mine.number].user_attrs["status"] == "ok"
