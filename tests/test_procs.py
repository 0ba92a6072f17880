"""Process scans: a probe's session, and the processes a killed search's probe left behind."""

import os
import subprocess
import sys
import time

from tunekit.launch.procs import kill_session, session_pids
from tunekit.rundir import RUN_DIR_ENV
from tunekit.search.storage import _end_orphan_probe

SLEEP_WITH_CHILD = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
                    " time.sleep(60)")


def _wait_for(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_session_is_found_whole_and_ended_whole():
    leader = subprocess.Popen([sys.executable, "-c", SLEEP_WITH_CHILD], start_new_session=True)
    try:
        assert _wait_for(lambda: len(session_pids(leader.pid)) == 2)  # the leader and the child it started
        assert leader.pid in session_pids(leader.pid) and os.getpid() not in session_pids(leader.pid)
        kill_session(leader.pid)
        leader.wait(timeout=10)
        assert session_pids(leader.pid) == []
    finally:
        leader.kill()


def test_a_left_behind_probe_process_is_found_by_its_run_dir_tag(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = dict(os.environ) | {RUN_DIR_ENV: str(run_dir.resolve())}
    tagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        _end_orphan_probe(str(run_dir))
        assert tagged.wait(timeout=10) != 0  # killed
        assert other.poll() is None  # a process without the tag is left alone
    finally:
        tagged.kill()
        other.kill()
