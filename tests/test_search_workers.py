"""What lets several search workers share one study: the admission lock, the budget holds of running probes,
and a configuration taken by a running trial in another worker. No probe runs here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from html import escape

import optuna
import pytest
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import load_recipe
from tunekit.search import space
from tunekit.search.budget import RESERVED_ATTR, RUNNING_ATTR, held
from tunekit.search.lock import StudyLock
from test_search import MICRO, ROOT, TEMP, _sqlalchemy_url, pg_study, write_recipe  # noqa: F401 (pg_study: a fixture)
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


def test_a_configuration_another_worker_is_probing_waits_for_its_result(tmp_path, monkeypatch):
    from tunekit.search import objective as objective_module

    monkeypatch.setattr(objective_module, "TWIN_POLL_S", 0.1)  # looks again soon after the other probe ends
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


# ---------------------------------------------------------------- three workers, one answer (PostgreSQL)


@pytest.mark.slow
@pytest.mark.service("PostgreSQL")
def test_three_workers_wait_for_each_other_confirm_once_and_give_one_answer(tmp_path, pg_study):
    url, name = pg_study
    recipe = write_recipe(tmp_path, [MICRO, TEMP], search={"confirm_top": 1, "confirm_seeds": 1})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "tunekit", "search", "--recipe", str(recipe), "--storage", url, "--study", name,
            "--gpu-profile", "cpu", "--budget-yuan", "5", "--trials", "2"]

    def start(w: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([*argv, *extra, "--out", str(tmp_path / w)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    workers = [start("w0")]
    storage = _sqlalchemy_url(url)
    deadline = time.monotonic() + 120
    while name not in optuna.study.get_all_study_names(storage):  # the others join the study the first one made
        assert time.monotonic() < deadline and workers[0].poll() is None, workers[0].communicate()[0][-2000:]
        time.sleep(0.5)
    workers += [start(w, "--resume") for w in ("w1", "w2")]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], "\n----\n".join(o[-1500:] for o in outs)
    study = optuna.load_study(study_name=name, storage=storage)
    # exactly one worker ran the confirmation round, and the study says which
    claim = study.user_attrs["confirmation_claim"]
    pids = {f"{socket.gethostname()}:{w.pid}": f"w{i}" for i, w in enumerate(workers)}
    assert claim["done"] and claim["worker"] in pids
    confirming = {p.parts[-4] for p in tmp_path.glob("w*/runs/*-c0-t*/summary.json")}
    assert confirming == {pids[claim["worker"]]}
    assert sum("the top candidates and the baseline again" in o for o in outs) == 1  # the round starts in one worker
    # every worker wrote and printed the same answer, read from the study
    results = [json.loads((tmp_path / f"w{i}" / "search.json").read_text()) for i in range(3)]
    same = ("reaches", "verdict", "answer", "confirmed_by", "confirmation")
    assert all({k: r[k] for k in same} == {k: results[0][k] for k in same} for r in results)
    assert results[0]["confirmed_by"] == claim["worker"] and results[0]["confirmation"] is not None
    answers = [next(line for line in o.splitlines() if line.startswith("answer:")) for o in outs]
    assert len(set(answers)) == 1, answers
    # tunekit report --storage shows that answer
    report = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--storage", url, "--study", name, "-o", str(report)])
    assert res.exit_code == 0, res.output
    assert escape(results[0]["reaches"]["title"]) in report.read_text()


ROUND = (1, 2, True)
"""A confirmation round's (confirm_top, confirm_seeds, confirm_references)."""


def test_exactly_one_worker_claims_the_confirmation_round_and_a_resumed_study_claims_again(tmp_path):
    from tunekit.search import finish

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    other = optuna.load_study(study_name="s", storage=storage)  # a second worker's handle
    rdb = optuna.storages.RDBStorage(storage)
    assert finish.claim(study, rdb, ROUND) is True
    assert finish.claim(other, rdb, ROUND) is False  # claimed, still running
    said = []
    assert finish.wait_for_round(other, 0.0, said.append, poll_s=0.0).startswith("the confirmation round in")
    assert [e["event"] for e in said] == ["wait_round"]
    finish.done(study, {"answer": "trial 0"})
    assert finish.wait_for_round(other, 5.0, said.append, poll_s=0.0) is None
    assert len(said) == 1  # a round already over is read back without a word of waiting
    assert finish.claim(other, rdb, ROUND) is False and other.user_attrs["search_result"] == {"answer": "trial 0"}
    # resumed with more seeds (the answer's advice for a reward within noise): the round goes on, claimed again
    more = (ROUND[0], ROUND[1] + 3, True)
    assert finish.claim(other, rdb, more) is True and finish.claim(study, rdb, more) is False
    finish.done(other, {"answer": "trial 0, over more seeds"})
    # resumed with the references left out, or brought back in: the round goes on too
    assert finish.claim(other, rdb, (*more[:2], False)) is True
    finish.done(other, {"answer": "trial 0, the references from their single probes"})
    # new trials since the round: a resumed search confirms again
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5))
    assert finish.claim(other, rdb, ROUND) is True
    # a claiming worker on this host that died is replaced
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    study.set_user_attr(finish.CLAIM_ATTR, {"worker": f"{socket.gethostname()}:{dead}", "trials": 2, "done": False})
    assert "stopped before it was done" in finish.wait_for_round(other, 5.0, lambda _e: None, poll_s=0.0)
    assert finish.claim(other, rdb, ROUND) is True


def test_a_worker_out_of_trials_waits_for_the_trials_other_workers_still_run(tmp_path):
    from tunekit.search import finish

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    running = study.ask()  # another worker's probe, started now
    running.set_user_attr("worker", "elsewhere:1")
    seen: list[dict] = []
    ender = threading.Timer(1.0, lambda: study.tell(running, 1.0))
    ender.start()
    t0 = time.monotonic()
    finish.wait_for_others(study, timeout_s=60, progress=seen.append, poll_s=0.1)
    assert time.monotonic() - t0 >= 0.9 and seen == [{"event": "wait", "trials": [0]}]
    # a trial running past its probe's timeout (and the grace) is not waited for
    late = study.ask()
    late.set_user_attr("worker", "elsewhere:1")
    t0 = time.monotonic()
    finish.wait_for_others(study, timeout_s=-1e4, progress=seen.append, poll_s=0.1)
    assert time.monotonic() - t0 < 1.0
