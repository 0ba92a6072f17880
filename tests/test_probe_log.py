"""log.txt keeps what the probe's processes print for the user, not the profiler's trace points."""

from __future__ import annotations

import subprocess

from tunekit.launch.output import copy_output

SCRIPT = """
echo 'USDT:2026-11-30 16:33:49 27743:27743 SyncActivityProfilerHandler.cpp:52] profiler_start'
echo 'UserWarning: something the user should see' >&2
echo
echo 'USDT:2026-11-30 16:33:49 27743:27743 SyncActivityProfilerHandler.cpp:59] profiler_stop'
(echo 'Traceback (most recent call last):'; echo '  RuntimeError: boom') >&2
printf 'a last line without a newline'
"""


def test_log_keeps_warnings_and_errors_and_drops_profiler_trace_points(tmp_path):
    proc = subprocess.Popen(["bash", "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    copier = copy_output(proc.stdout, tmp_path / "log.txt")
    proc.wait(timeout=30)
    copier.join(timeout=30)
    assert not copier.is_alive()
    assert (tmp_path / "log.txt").read_text().splitlines() == [
        "UserWarning: something the user should see", "Traceback (most recent call last):", "  RuntimeError: boom",
        "a last line without a newline"]
