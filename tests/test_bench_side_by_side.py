"""benchmarks/side_by_side.py: a job stopped at its limit takes its probes with it, whatever session they started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from side_by_side import descendants, kill_tree, parse_job  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _escaped(job: int) -> bool:
    """Whether a process below ``job`` runs in a session other than the job's."""
    sids = set()
    for pid in descendants(job):
        try:
            sids.add(os.getsid(pid))
        except ProcessLookupError:
            pass
    return bool(sids - {os.getsid(job)})


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_kill_tree_reaches_a_child_in_its_own_session() -> None:
    job = subprocess.Popen(["bash", "-c", "setsid sleep 60 & sleep 60"], start_new_session=True)
    try:
        # wait for the state under test, not for a process count: the forked child exists before it calls setsid
        deadline = time.monotonic() + 10
        while not _escaped(job.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        below = descendants(job.pid)
        assert len(below) >= 2  # the job's sleep and the setsid one
        assert _escaped(job.pid)  # one left the job's session
        kill_tree(job.pid, grace_s=0.2)
        job.wait(timeout=5)
        assert not any(_alive(pid) for pid in below)
    finally:
        if job.poll() is None:
            job.kill()


def test_parse_job_splits_gpus_and_commands() -> None:
    assert parse_job("0,1 :: matrix.py gpu15 ;; update_bench.py --reps 2") == (
        "0,1", [["matrix.py", "gpu15"], ["update_bench.py", "--reps", "2"]])
    # variant names hold spaces: quoted as in a shell
    assert parse_job("0 :: update_bench.py --only 'actor micro 16' 'actor micro 16, compiled'") == (
        "0", [["update_bench.py", "--only", "actor micro 16", "actor micro 16, compiled"]])
    with pytest.raises(SystemExit, match="not 'GPUS :: SCRIPT ARGS'"):
        parse_job("0,1 matrix.py")
