"""Why a probe ended: its ranks' error records, the launcher's timeout, or the last words in its log.

A rank that raises writes ``error-rank<R>.json`` (oom / failed). A rank killed by a signal (a C++ library's
uncaught exception aborts, the kernel's OOM killer kills) writes nothing; torchrun then reports the rank and the
signal, and the other ranks fail after it with errors of their own ("connection reset by peer"). The reason
must name the rank that died first and what it said before it died, not the ranks that died of it.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tunekit import rundir

# torchrun's report of a failed rank: its agent's log lines, then ChildFailedError's "Root Cause" block
_REPORT_START = re.compile(r"^[WEI]\d{4} .*torch/distributed/elastic/")
_ROOT_RANK = re.compile(r"^\s*rank\s*: (\d+)")
_ROOT_SIGNAL = re.compile(r"^\s*traceback : (Signal \d+ \(\w+\)) received")
# what a dying process says on stderr: C++'s std::terminate, Python's faulthandler (its innermost frame follows
# the "most recent call first" line of the current thread)
_LAST_WORDS = re.compile(r"terminate called|what\(\):|Fatal Python error")
_CURRENT_THREAD = re.compile(r"^Current thread .*most recent call first")
REASON_CHARS = 500


def outcome(run_dir: Path, rc: int | None, timed_out: str | None, planned_steps: int | None = None) -> tuple[str, str]:
    """``(status, reason)`` of a finished or killed probe. One killed at its timeout after all ``planned_steps`` of
    its steps finished (in its teardown: a model saved, an engine shut down) measured everything a probe measures:
    ok, with the kill as its reason."""
    lines = rundir.read_log(run_dir)
    died = None if timed_out else signal_death(lines)  # a probe the launcher killed ends as a timeout
    errors = rundir.read_errors(run_dir)
    if died is not None and not any(e["rank"] == died[0] for e in errors):
        rank, signal = died
        words = last_words(lines)
        return "failed", f"rank {rank} died: {signal}" + (": " + " | ".join(words) if words else "")[:REASON_CHARS]
    if errors:
        worst = next((e for e in errors if e["status"] == "oom"), errors[0])
        return worst["status"], worst["message"]
    if timed_out:
        done = rundir.steps_done(run_dir)
        if planned_steps and done >= planned_steps:
            return "ok", f"all {done} steps finished; killed in its teardown: {timed_out}"
        return "timeout", timed_out
    if rc == 0 and rundir.read_result(run_dir) is not None:
        return "ok", ""
    if rc is not None and rc < 0:  # killed by a signal from outside: its last lines are not why
        return "failed", f"killed by {_signal_name(-rc)} (exit code {rc}) after {rundir.steps_done(run_dir)} step(s)"
    return "failed", f"exit code {rc}: " + " | ".join(lines[-5:])[-REASON_CHARS:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signal_death(lines: list[str]) -> tuple[int, str] | None:
    """``(rank, "Signal 6 (SIGABRT)")`` when torchrun's root cause is a rank killed by a signal, else None."""
    report = lines[_report_start(lines):]
    root = next((i for i, line in enumerate(report) if line.startswith("Root Cause")), None)
    rank = None
    for line in report[root:] if root is not None else []:
        if m := _ROOT_RANK.match(line):
            rank = int(m.group(1))
        elif (m := _ROOT_SIGNAL.match(line)) and rank is not None:
            return rank, m.group(1)
    return None


def last_words(lines: list[str], n: int = 3) -> list[str]:
    """The last ``n`` lines a dying process wrote before torchrun's report: terminate / what() / faulthandler's
    header and innermost frame."""
    before = lines[:_report_start(lines)]
    words = []
    for i, line in enumerate(before):
        if _LAST_WORDS.search(line):
            words.append(line.strip())
        elif _CURRENT_THREAD.match(line) and i + 1 < len(before):
            words.append(before[i + 1].strip())
    return words[-n:]


def _report_start(lines: list[str]) -> int:
    return next((i for i, line in enumerate(lines) if _REPORT_START.match(line)), len(lines))
