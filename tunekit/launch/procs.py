"""Ending a probe's process tree: its process group, then what is left of its session, then its servers.

A probe is a new session (``start_new_session``). Its processes stay in that session even
when they lead their own process group, as Ray workers do, so the session reaches what
``killpg`` misses. A vLLM server the trainer starts is its own session; it leaves a
process-group file in the run directory that :func:`kill_leftover_servers` reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tunekit.rundir import server_groups


def kill_tree(proc: subprocess.Popen) -> None:
    """Terminate the probe's whole process group, then kill what is left of its session."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            try:  # children may outlive the leader; finish them
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
    kill_session(proc.pid)


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (zombies left out: they are already dead)."""
    pids = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                pids.append(p.pid)
        except (psutil.Error, OSError):  # gone, or not ours to read
            continue
    return pids


def kill_session(sid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of session ``sid`` until none is left (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while (pids := session_pids(sid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)


def kill_leftover_servers(run_dir: Path) -> None:
    """Kill server process groups a probe left behind (its trainer died before stopping them)."""
    for f in server_groups(run_dir):
        try:
            os.killpg(int(f.read_text().strip()), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
        f.unlink(missing_ok=True)
