"""The ``loadtest:`` section: how ``tunekit loadtest`` loads a rollout engine, and the pass line it checks."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from tunekit.config.base import Effect, ServerUrl, Strict


class LoadtestConfig(Strict):
    """A load test of the rollout engine: single-request latency, then QPS, tokens/s and latency percentiles at
    rising concurrency. It changes nothing a probe runs."""

    effect: ClassVar[Effect] = "probe"

    url: ServerUrl = None
    """An OpenAI-compatible server to load (``http://host:port``; vLLM's ``/v1/completions``). Default: the
    recipe's own rollout server (``system.rollout.server_url``), else a ``vllm serve`` that tunekit starts on the
    rollout GPUs with the recipe's engine knobs and stops afterwards."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the server's API key (sent as a bearer token when set; never printed or
    written)."""
    concurrency: list[int] = Field(default_factory=lambda: [1, 8, 32, 64])
    """Requests in flight at each level, measured in rising order; 1 (the single-request latency) and
    ``at_concurrency`` are always measured."""
    max_latency_ms: float = Field(800.0, gt=0)
    """Pass line: the median latency of a single request (concurrency 1) must be at most this."""
    min_qps: float = Field(42.0, gt=0)
    """Pass line: completed requests per second at ``at_concurrency`` must be at least this."""
    at_concurrency: int = Field(64, gt=0)
    """The concurrency level the QPS pass line is read at."""
    min_requests: int = Field(20, ge=20)
    """Requests measured at every level at least (percentiles of fewer say little)."""
    rounds: int = Field(4, gt=0)
    """A level sends ``concurrency x rounds`` requests (at least ``min_requests``): every slot is refilled this many
    times, so the ramp at the level's start and end weighs little."""
    warmup_requests: int = Field(8, ge=0)
    """Requests sent at each level's concurrency before it is measured, not counted."""
    max_tokens: int | None = Field(None, gt=0)
    """New tokens per request; default: the recipe's ``task.max_new_tokens``."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature; default: the recipe's ``task.temperature``."""
    ignore_eos: bool = True
    """Generate exactly ``max_tokens`` (vLLM's ``ignore_eos``), so two configurations do the same work."""
    stream: bool = True
    """Stream the responses, which gives the time to first token (``ttft_ms_p50``)."""
    prompts: int = Field(64, gt=0)
    """Distinct prompts drawn from the recipe's workload, sent in turn."""
    timeout_s: float = Field(60.0, gt=0)
    """A request that has not finished after this long is a failed request."""
    client: Literal["auto", "vllm_bench", "http"] = "auto"
    """What sends the requests: ``vllm_bench`` (vLLM's own ``vllm bench serve``, one run per level, its JSON
    result read back; it needs vLLM and Hugging Face's ``datasets``), ``http`` (tunekit's async HTTP client), ``auto``
    (vLLM's where it can run)."""

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("must be a non-empty list of positive request counts, e.g. [1, 8, 32, 64]")
        return v


    @property
    def levels(self) -> list[int]:
        """The concurrency levels measured, rising: ``concurrency`` plus 1 and ``at_concurrency``."""
        return sorted(set(self.concurrency) | {1, self.at_concurrency})

    def requests_at(self, concurrency: int) -> int:
        """Requests measured at one level."""
        return max(self.min_requests, concurrency * self.rounds)
