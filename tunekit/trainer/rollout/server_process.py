"""A vLLM server as a child process, and the small HTTP client tunekit needs (stdlib only, no vllm import).

The server runs in its own process group, so stopping it stops its engine and worker
processes too. Three things make sure it never outlives the probe: ``stop()`` (also
registered with ``atexit``), a parent-death signal (the trainer was killed), and a
process-group file (``pgid_path``) that the launcher kills after the probe
(:func:`tunekit.launch.procs.kill_leftover_servers`).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tunekit.rundir import PGID_SUFFIX

# Proxies from the environment must not see calls to a local server.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

try:  # loaded in the parent, so the child only calls prctl between fork and exec
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _LIBC = None
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The vLLM server did not start, stopped answering, or died; the message carries its last log lines."""


class HTTPStatusError(RuntimeError):
    def __init__(self, status: int, url: str, body: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {body[:300]}")
        self.status = status


def http_json(method: str, url: str, body: Any = None, *, timeout: float = 30.0,
              headers: dict[str, str] | None = None) -> Any:
    """One JSON request; returns the decoded body (None when empty). Raises HTTPStatusError or OSError."""
    data = json.dumps(body).encode() if body is not None else None
    headers = ({"Content-Type": "application/json"} if data is not None else {}) | (headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise HTTPStatusError(e.code, url, e.read().decode(errors="replace")) from None
    return json.loads(raw) if raw.strip() else None


def http_text(url: str, *, timeout: float = 5.0) -> str:
    """The body of a GET as text (a ``/metrics`` page). Raises HTTPStatusError or OSError."""
    try:
        with _OPENER.open(urllib.request.Request(url, method="GET"), timeout=timeout) as resp:
            return resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        raise HTTPStatusError(e.code, url, e.read().decode(errors="replace")) from None


def health_problem(url: str, *, timeout_s: float = 5.0) -> str | None:
    """None when ``url``/health answers 200; else a short reason (for one-sentence errors)."""
    try:
        http_json("GET", f"{url}/health", timeout=timeout_s)
        return None
    except HTTPStatusError as e:
        return f"/health answered HTTP {e.status}"
    except (OSError, ValueError) as e:  # refused, unreachable, timed out, malformed URL
        return f"no answer: {getattr(e, 'reason', e)}"


def local_address_towards(url: str) -> str:
    """This machine's address as seen from the host in ``url`` (where a server's workers can reach us)."""
    host = urllib.parse.urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent; this only picks the route
        return s.getsockname()[0]


def _stop_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the trainer dies."""
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """Starts ``command``, waits for ``url``/health, stops the whole process group."""

    def __init__(self, command: list[str], *, url: str, log_path: Path, pgid_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``pgid_path``: where the server's process group is recorded; default: beside the log."""
        self.command, self.url, self.log_path, self.env = command, url, Path(log_path), env
        self.pgid_path = Path(pgid_path) if pgid_path else self.log_path.with_suffix(PGID_SUFFIX)
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout_s: float, poll_s: float = 0.5) -> None:
        """Launch and wait until healthy; on timeout or early exit, stop it and raise ServerError."""
        self.launch()
        self.wait_healthy(timeout_s=timeout_s, poll_s=poll_s)

    def launch(self) -> None:
        """Start the server's process group; it is stopped when the thread that calls this exits (the parent-death
        signal is a thread's), so call it from the thread that outlives the server."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, preexec_fn=_stop_with_parent)
        self.pgid_path.write_text(str(self.proc.pid))
        atexit.register(self.stop)

    def wait_healthy(self, *, timeout_s: float, poll_s: float = 0.5) -> None:
        """Wait until ``url``/health answers; on timeout or early exit, stop the server and raise ServerError."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                code = self.proc.returncode
                self.stop()
                raise ServerError(f"vLLM server exited with code {code} before answering; {self.log_excerpt()}")
            if health_problem(self.url, timeout_s=min(5.0, timeout_s)) is None:
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"vLLM server did not answer {self.url}/health within {timeout_s:g} s "
                                  f"(system.rollout.server_timeout_s); {self.log_excerpt()}")
            time.sleep(poll_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 6) -> list[str]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return [ln.strip()[-160:] for ln in lines if ln.strip()][-n:]

    def log_excerpt(self, max_chars: int = 330) -> str:
        """The last log lines in one line, short enough for a probe's failure reason."""
        tail = " | ".join(self.log_tail())
        return f"last lines of {self.log_path}: {tail[-max_chars:] or '(empty)'}"

    def check(self) -> None:
        """Raise ServerError if the server has died."""
        if self.proc is not None and not self.alive():
            raise ServerError(f"vLLM server (pid {self.proc.pid}) exited with code {self.proc.returncode} "
                              f"mid-probe; {self.log_excerpt()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            try:  # workers may outlive the leader
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        self.proc.poll()
        self.pgid_path.unlink(missing_ok=True)


def start_together(servers: list[ServerProcess], *, timeout_s: float) -> None:
    """Launch every server from this thread, then wait for all of them at once; if one fails, stop them all and
    raise its error. Launched here and not in the waiting threads: a server's parent-death signal
    (``PR_SET_PDEATHSIG``) fires when the thread that started it exits, so one started in a pool's thread would be
    stopped as soon as the pool closed."""
    for server in servers:
        server.launch()
    with ThreadPoolExecutor(max_workers=len(servers)) as ex:
        waits = [ex.submit(server.wait_healthy, timeout_s=timeout_s) for server in servers]
    errors = [w.exception() for w in waits if w.exception() is not None]
    if errors:
        for server in servers:
            server.stop()
        raise errors[0]
