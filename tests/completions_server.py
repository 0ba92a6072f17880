"""A small OpenAI-style ``/v1/completions`` server for load-test tests: loopback only, a thread of this process,
with injected latency, streamed or not, and ways to fail (HTTP 500, malformed JSON, too slow). It stops when the
``with`` block ends, and by itself after ``lifetime_s`` whatever happens."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    latency_s: float = 0.02
    """Unstreamed: the delay before the answer. Streamed: the delay before the first token."""
    token_gap_s: float = 0.0
    """Streamed: the delay between tokens after the first."""
    tokens: int = 4
    mode: str = "ok"
    """ok / http500 / malformed (an answer that is not JSON) / slow (answers after ``slow_s``) / stream_error (a
    streamed answer whose chunk reports an error)."""
    slow_s: float = 1.0
    ok_requests: int | None = None
    """Answer this many completion requests, then answer every later one with HTTP 500."""
    api_key: str | None = None
    """Answer 401 to requests without this bearer token."""
    served: int = 0
    models_asked: int = 0
    """GET /v1/models requests answered."""
    seen_keys: set = field(default_factory=set)
    prompts: list = field(default_factory=list)
    """Every completion request's prompt, as received."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(b: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _authorized(self) -> bool:
            got = self.headers.get("Authorization", "")
            with b.lock:
                b.seen_keys.add(got)
            if b.api_key and got != f"Bearer {b.api_key}":
                self._json(401, b'{"error": "unauthorized"}')
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            if self.path == "/v1/models":
                with b.lock:
                    b.models_asked += 1
                self._json(200, json.dumps({"data": [{"id": "fake-model"}]}).encode())
            else:
                self._json(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if not self._authorized():
                return
            with b.lock:
                b.served += 1
                b.prompts.append(body.get("prompt"))
                n = b.served
            if b.mode == "http500" or (b.ok_requests is not None and n > b.ok_requests):
                self._json(500, b'{"error": "engine failed"}')
                return
            if b.mode == "slow":
                time.sleep(b.slow_s)
            if b.mode == "malformed":
                time.sleep(b.latency_s)
                self._json(200, b"{not json")
                return
            tokens = min(b.tokens, int(body.get("max_tokens", b.tokens)))
            if body.get("stream"):
                self._stream(tokens)
            else:
                time.sleep(b.latency_s + b.token_gap_s * (tokens - 1))
                answer = {"choices": [{"text": "x" * tokens, "index": 0}], "usage": {"completion_tokens": tokens}}
                self._json(200, json.dumps(answer).encode())

        def _stream(self, tokens: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            time.sleep(b.latency_s)
            if b.mode == "stream_error":
                self.wfile.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n')
                return
            for i in range(tokens):
                if i:
                    time.sleep(b.token_gap_s)
                self.wfile.write(f"data: {json.dumps({'choices': [{'text': 'x', 'index': 0}]})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': tokens}})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a burst of connections must not wait on the default backlog of 5

    def handle_error(self, request, client_address) -> None:
        """A client that gave up (its timeout) closed the connection: nothing to report."""


@contextmanager
def completions_server(behaviour: Behaviour, *, lifetime_s: float = 60.0):
    """Serve ``behaviour`` at ``http://127.0.0.1:<port>``; yields the URL."""
    server = _Server(("127.0.0.1", 0), _handler(behaviour))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stopper = threading.Timer(lifetime_s, server.shutdown)
    stopper.daemon = True
    stopper.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stopper.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
