"""A free local TCP port, for process-group rendezvous and servers tunekit starts (stdlib only)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
