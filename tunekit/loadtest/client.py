"""tunekit's async HTTP load client for an OpenAI-compatible ``/v1/completions`` endpoint (aiohttp).

One level of a load test: a few warm-up requests that are not counted, then ``requests`` requests with at most
``concurrency`` in flight, each timed from send to its last byte (and to its first streamed token). A request that
fails (no connection, an HTTP error, an answer that is not a completion, no answer in time) is recorded with one
sentence saying why; the level goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Endpoint:
    """Where the requests go: the server's base URL, the model name it serves, the API key (never shown)."""

    url: str
    model: str
    api_key: str | None = None

    @property
    def completions(self) -> str:
        return f"{self.url}/v1/completions"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def __repr__(self) -> str:  # the key stays out of logs and tracebacks
        return f"Endpoint(url={self.url!r}, model={self.model!r})"


@dataclass(frozen=True)
class Outcome:
    """One request: its latency and time to first token (seconds), completion tokens, or why it failed."""

    latency_s: float | None = None
    ttft_s: float | None = None
    tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Sampling:
    """What every request asks for."""

    max_tokens: int
    temperature: float
    ignore_eos: bool
    stream: bool

    def body(self, model: str, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": self.stream}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension of the OpenAI request
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body


class ModelsError(Exception):
    """``/v1/models`` gave no model: ``status`` is the HTTP status (None: no answer, or no model in it)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


async def _first_model(url: str, headers: dict[str, str], timeout_s: float) -> str:
    try:
        async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(f"{url}/v1/models", headers=headers) as resp:
                if resp.status != 200:
                    raise ModelsError(f"HTTP {resp.status}", resp.status)
                listing = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError) as e:
        raise ModelsError(f"no answer: {type(e).__name__}: {e}") from None
    except ValueError:
        raise ModelsError("its answer is not JSON") from None
    try:
        return str(listing["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ModelsError("no model in its answer") from None


def first_model(url: str, api_key: str | None, *, timeout_s: float = 10.0) -> str:
    """The first model a server lists at ``/v1/models`` (as vLLM's own benchmark client picks it); raises
    ModelsError."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return asyncio.run(_first_model(url, headers, timeout_s))


class _Failed(Exception):
    """A request that did not give a completion; the message is the sentence recorded."""


def _completion_tokens(answer: dict[str, Any]) -> int | None:
    usage = answer.get("usage") or {}
    n = usage.get("completion_tokens")
    return int(n) if isinstance(n, (int, float)) else None


async def _plain(resp: aiohttp.ClientResponse) -> tuple[float | None, int | None]:
    text = await resp.text()
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        raise _Failed(f"the answer is not JSON: {text[:80]!r}") from None
    if not isinstance(answer, dict) or not answer.get("choices"):
        raise _Failed(f"the answer has no completion choices: {text[:80]!r}")
    return None, _completion_tokens(answer)


async def _streamed(resp: aiohttp.ClientResponse, start: float) -> tuple[float | None, int | None]:
    """Server-sent events: ``data: {chunk}`` lines up to ``data: [DONE]``; the first chunk with a choice is the
    first token. Tokens: the usage chunk's count, else one a chunk."""
    ttft, chunks, tokens, done = None, 0, None, False
    async for raw in resp.content:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise _Failed(f"a streamed chunk is not JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise _Failed(f"a streamed chunk is not a completion chunk: {data[:80]!r}")
        if chunk.get("error"):  # a server that fails mid-stream says so in a chunk of its own
            raise _Failed(f"the server reported an error mid-stream: {str(chunk['error'])[:120]}")
        if chunk.get("choices"):
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - start
        tokens = _completion_tokens(chunk) if chunk.get("usage") else tokens
    if not done or ttft is None:
        raise _Failed("the stream ended before a completion and its [DONE] line")
    return ttft, tokens if tokens is not None else chunks


async def one_request(session: aiohttp.ClientSession, endpoint: Endpoint, sampling: Sampling, prompt: str,
                      timeout_s: float) -> Outcome:
    """Send one completion request and time it."""
    start = time.perf_counter()
    try:
        async with session.post(endpoint.completions, json=sampling.body(endpoint.model, prompt),
                                headers=endpoint.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                body = (await resp.text())[:120]
                raise _Failed(f"HTTP {resp.status} from {endpoint.completions}: {body!r}")
            ttft, tokens = await (_streamed(resp, start) if sampling.stream else _plain(resp))
    except _Failed as e:
        return Outcome(error=str(e))
    except (asyncio.TimeoutError, TimeoutError):  # distinct classes before Python 3.11
        return Outcome(error=f"no complete answer within {timeout_s:g} s (loadtest.timeout_s)")
    except aiohttp.ClientError as e:
        return Outcome(error=f"the request to {endpoint.completions} failed: {type(e).__name__}: {e}")
    return Outcome(latency_s=time.perf_counter() - start, ttft_s=ttft, tokens=tokens)


async def _send(session: aiohttp.ClientSession, endpoint: Endpoint, sampling: Sampling, prompts: list[str],
                count: int, concurrency: int, timeout_s: float) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> Outcome:
        async with gate:
            return await one_request(session, endpoint, sampling, prompts[i % len(prompts)], timeout_s)

    return list(await asyncio.gather(*(gated(i) for i in range(count))))


async def _level(endpoint: Endpoint, sampling: Sampling, prompts: list[str], *, concurrency: int, requests: int,
                 warmup: int, timeout_s: float) -> tuple[list[Outcome], float]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        warm = await _send(session, endpoint, sampling, prompts, warmup, concurrency, timeout_s)
        if warm and all(o.error is not None for o in warm):  # it answers none: the measured ones would wait as long
            return [Outcome(error=f"every warm-up request failed, the level was not measured: {o.error}") for o in warm], 0.0
        start = time.perf_counter()
        outcomes = await _send(session, endpoint, sampling, prompts, requests, concurrency, timeout_s)
        return outcomes, time.perf_counter() - start


def run_level(endpoint: Endpoint, sampling: Sampling, prompts: list[str], *, concurrency: int, requests: int,
              warmup: int, timeout_s: float) -> tuple[list[Outcome], float]:
    """One level: ``warmup`` uncounted requests, then ``requests`` with ``concurrency`` in flight. Returns each
    measured request's outcome and the seconds from the first send to the last answer; where every warm-up request
    failed, those (the level not measured: a server that answers nothing would keep each request to its timeout)."""
    return asyncio.run(_level(endpoint, sampling, prompts, concurrency=concurrency, requests=requests, warmup=warmup,
                              timeout_s=timeout_s))
