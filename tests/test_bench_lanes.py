"""benchmarks/lanes.py: a lane stopped at its limit takes its probes with it, whatever session they started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from lanes import descendants, kill_tree, parse_lane  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _escaped(lane: int) -> bool:
    """Whether a process below ``lane`` runs in a session other than the lane's."""
    sids = set()
    for pid in descendants(lane):
        try:
            sids.add(os.getsid(pid))
        except ProcessLookupError:
            pass
    return bool(sids - {os.getsid(lane)})


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_kill_tree_reaches_a_child_in_its_own_session() -> None:
    lane = subprocess.Popen(["bash", "-c", "setsid sleep 60 & sleep 60"], start_new_session=True)
    try:
        # wait for the state under test, not for a process count: the forked child exists before it calls setsid
        deadline = time.monotonic() + 10
        while not _escaped(lane.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        below = descendants(lane.pid)
        assert len(below) >= 2  # the lane's sleep and the setsid one
        assert _escaped(lane.pid)  # one left the lane's session
        kill_tree(lane.pid, grace_s=0.2)
        lane.wait(timeout=5)
        assert not any(_alive(pid) for pid in below)
    finally:
        if lane.poll() is None:
            lane.kill()


def test_parse_lane_splits_gpus_and_commands() -> None:
    assert parse_lane("0,1 :: matrix.py gpu15 ;; update_bench.py --reps 2") == (
        "0,1", [["matrix.py", "gpu15"], ["update_bench.py", "--reps", "2"]])
    # variant names hold spaces: quoted as in a shell
    assert parse_lane("0 :: update_bench.py --only 'actor micro 16' 'actor micro 16, compiled'") == (
        "0", [["update_bench.py", "--only", "actor micro 16", "actor micro 16, compiled"]])
    with pytest.raises(SystemExit, match="not 'GPUS :: SCRIPT ARGS'"):
        parse_lane("0,1 matrix.py")
