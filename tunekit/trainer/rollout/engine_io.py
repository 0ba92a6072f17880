"""What goes into and comes out of a vLLM engine, as pure functions (no vllm import), and the watches over its
KV cache that the backends run around a generation: the in-process engine's every step (``StepTap``), or a
poll of its Prometheus metrics (``KVCacheWatch``: a server's ``/metrics``, or ``LLM.get_metrics``).

Both vLLM backends share these: the in-process engine passes the sampling dict to
``SamplingParams``, the server client sends it as the JSON body of ``/v1/completions``
(the keys are fields of both).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tunekit.workload.seeds import step_seed

BUCKET_BYTES = 256 * 1024**2
"""Weights move to the engine in buckets of about this size: one gathered bucket in flight, not the model."""

_SEED_MOD = 2**31 - 1


def prompt_token_lists(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompts [B, T] and their mask → one list of real token ids per row (padding stripped)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]


def row_seeds(seed: int, n: int) -> list[int]:
    """One sampling seed per row, derived from the call's seed.

    Rows get distinct seeds, so repeated prompts (GRPO groups) get different samples,
    and the same call seed gives the same samples again.
    """
    base = step_seed(seed, 0) % _SEED_MOD
    return [(base + i) % _SEED_MOD for i in range(n)]


def sampling_kwargs(*, temperature: float, max_new_tokens: int, fixed_length: bool, eos_id: int,
                    seed: int, logprobs: bool = True) -> dict[str, Any]:
    """Sampling parameters that match what the actor's logprobs assume.

    Pure temperature sampling over the full vocabulary (no top-k/top-p/penalties, whatever
    the checkpoint's generation config says). EOS is a stop token, so it ends a response
    and is kept in it; ``fixed_length`` sets ``min_tokens`` to the budget, which masks EOS
    at every position, the way HF's ``min_new_tokens`` does. ``logprobs=0`` returns the
    sampled token's logprob only; ``logprobs`` false asks for none (``None``).
    """
    return {
        "n": 1, "temperature": temperature, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "max_tokens": max_new_tokens, "min_tokens": max_new_tokens if fixed_length else 0,
        "stop_token_ids": [eos_id], "logprobs": 0 if logprobs else None, "seed": seed,
    }


def build_requests(prompts: dict[str, torch.Tensor], *, seed: int, temperature: float, max_new_tokens: int,
                   fixed_length: bool, eos_id: int, logprobs: bool = True) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """A prompt batch (``prompt_ids``, ``prompt_mask``) → token lists and one sampling dict per row."""
    rows = prompt_token_lists(prompts["prompt_ids"], prompts["prompt_mask"])
    params = [sampling_kwargs(temperature=temperature, max_new_tokens=max_new_tokens, fixed_length=fixed_length,
                              eos_id=eos_id, seed=s, logprobs=logprobs) for s in row_seeds(seed, len(rows))]
    return rows, params


def sampled_logprobs(token_ids: Sequence[int], position_logprobs: Sequence[Any]) -> list[float]:
    """The sampled token's logprob at each position, from vLLM's per-position ``{token_id: Logprob}`` maps."""
    if len(position_logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(position_logprobs)} logprob positions")
    return [float(pos[tok].logprob) for tok, pos in zip(token_ids, position_logprobs)]


def pad_responses(token_ids: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]] | None, *, length: int,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ragged responses → (ids [B, length] long, right-padded with ``pad_id``; logprobs [B, length] float32,
    0 on pads, or None when none were asked for).

    EOS, when a response has one, stays in it; the loop's response mask ends there.
    """
    ids = torch.full((len(token_ids), length), pad_id, dtype=torch.long)
    logp = None if logprobs is None else torch.zeros((len(token_ids), length), dtype=torch.float32)
    for i, toks in enumerate(token_ids):
        n = min(len(toks), length)
        ids[i, :n] = torch.as_tensor(list(toks[:n]), dtype=torch.long)
        if logp is not None:
            if len(toks) != len(logprobs[i]):
                raise ValueError(f"row {i}: {len(toks)} tokens but {len(logprobs[i])} logprobs")
            logp[i, :n] = torch.as_tensor(list(logprobs[i][:n]), dtype=torch.float32)
    return ids, logp


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def bucket_weights(named: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int = BUCKET_BYTES,
                   dtype: torch.dtype | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of at most ``bucket_bytes`` (a larger tensor goes alone).

    Floating tensors are cast to ``dtype`` first (the engine's), so a bucket holds what is
    sent. The input is consumed lazily: at most one bucket of gathered tensors is alive.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.contiguous()
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def compilation_config(enforce_eager: bool, torch_compile: bool, max_batch: int | None = None) -> dict | None:
    """vLLM's ``compilation_config`` for the rollout knobs (None: vLLM's default, or eager). ``max_batch``
    (:func:`most_sequences`): CUDA graphs are captured for decode batches up to it only, not up to vLLM's default
    (hundreds of sequences), so the engine starts after fewer captures; a batch the probe replays is never larger."""
    if enforce_eager:
        return None
    cc = {} if torch_compile else {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}  # decode graphs, no compile
    if max_batch is not None:
        cc["max_cudagraph_capture_size"] = max_batch
    return cc or None


def most_sequences(recipe: Any) -> int:
    """The most sequences one engine of ``recipe`` decodes at once: the step's samples, or
    ``system.rollout.max_num_seqs`` when that is lower."""
    sysc = recipe.system
    return min(sysc.batch.samples_per_step, sysc.rollout.max_num_seqs or sysc.batch.samples_per_step)


ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill")
"""``system.rollout`` keys that are vLLM engine arguments of the same name and meaning (unset: vLLM's default)."""


def engine_knobs(rollout: Any) -> dict[str, Any]:
    """The engine arguments a recipe's ``system.rollout`` sets, as ``vllm.LLM`` keyword arguments; unset keys are
    left out, so vLLM keeps its own defaults."""
    return {k: v for k in ENGINE_KNOBS if (v := getattr(rollout, k)) is not None}


def engine_flags(knobs: dict[str, Any]) -> list[str]:
    """The same arguments as ``vllm serve`` flags: ``--max-num-seqs 64``, ``--enable-prefix-caching`` /
    ``--no-enable-prefix-caching`` (vLLM's boolean flags take a ``no-`` form)."""
    out: list[str] = []
    for key, value in knobs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
"""vLLM's gauge of the fraction of KV-cache blocks in use (0 to 1), as ``LLM.get_metrics()`` names it."""
LEGACY_KV_USAGE_METRIC = "vllm:gpu_cache_usage_perc"
"""The same gauge's name before vLLM 0.11."""
PREEMPTIONS_METRIC = "vllm:num_preemptions"
"""vLLM's counter of requests preempted (their KV cache evicted, to be recomputed) since the engine started."""


def engine_stats(metrics: Iterable[Any]) -> tuple[float | None, float | None]:
    """(KV-cache usage now, preemptions so far) from ``LLM.get_metrics()``'s list (objects with ``name`` and
    ``value``); None where the metric is absent. Several label sets (engines) give the fullest cache and the
    preemptions summed."""
    usage: float | None = None
    preempted: float | None = None
    for m in metrics:
        name = getattr(m, "name", "")
        if name in (KV_USAGE_METRIC, LEGACY_KV_USAGE_METRIC):
            usage = max(usage or 0.0, float(m.value))
        elif name in (PREEMPTIONS_METRIC, PREEMPTIONS_METRIC + "_total"):
            preempted = (preempted or 0.0) + float(m.value)
    return usage, preempted


def kv_signal(usage_samples: Sequence[float], preemptions_before: float | None,
              preemptions_after: float | None) -> dict[str, float]:
    """One generation's KV-cache record: ``rollout/kv_usage_peak`` (the fullest the cache was seen, 0 to 1) and
    ``rollout/preemptions`` (requests preempted during it); a key is left out when the engine did not report it."""
    out: dict[str, float] = {}
    if usage_samples:
        out["rollout/kv_usage_peak"] = max(usage_samples)
    if preemptions_before is not None and preemptions_after is not None:
        out["rollout/preemptions"] = preemptions_after - preemptions_before
    return out


@dataclass(frozen=True)
class Sample:
    name: str
    value: float


def prometheus_samples(text: str) -> list[Sample]:
    """A server's ``/metrics`` page (Prometheus text) → its samples, named as exposed (counters end in ``_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [Sample(s.name, float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples]


class KVCacheWatch:
    """Watches an engine's KV-cache usage during one generation (a thread calls ``read_metrics`` every
    ``interval_s``: ``LLM.get_metrics``, or a server's ``/metrics`` parsed; the gauge is set at each engine step)
    and counts its preemptions; ``signal`` is the record."""

    def __init__(self, read_metrics: Callable[[], Iterable[Any]], interval_s: float = 0.05) -> None:
        self.read_metrics, self.interval_s = read_metrics, interval_s
        self.samples: list[float] = []
        self.signal: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kv-cache-watch", daemon=True)
        self._before: float | None = None
        self._stale: float | None = None

    def _read(self) -> float | None:
        usage, preempted = engine_stats(self.read_metrics())
        if usage is not None and not (usage == self._stale and not self.samples):
            self.samples.append(usage)
        return preempted

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> KVCacheWatch:
        # the gauge holds the previous generation's last step until the engine steps again: readings equal to
        # it count only once it has changed (a watch that starts before the engine does would see it)
        self._stale, self._before = engine_stats(self.read_metrics())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        after = self._read()
        self.signal = kv_signal(self.samples, self._before, after)


def step_reading(scheduler_stats: Any, iteration_stats: Any) -> tuple[float | None, float | None]:
    """(KV-cache usage after one engine step, 0 to 1; requests preempted in that step) from the stats vLLM's engine
    hands its stat loggers every step (``SchedulerStats.kv_cache_usage``, ``gpu_cache_usage`` before vLLM 0.11;
    ``IterationStats.num_preempted_reqs``); None where absent."""
    usage = getattr(scheduler_stats, "kv_cache_usage", None)
    if usage is None:
        usage = getattr(scheduler_stats, "gpu_cache_usage", None)
    preempted = getattr(iteration_stats, "num_preempted_reqs", None)
    return (None if usage is None else float(usage)), (None if preempted is None else float(preempted))


class StepTap:
    """The KV-cache signal of one generation from every step of an in-process engine: the engine's stat-logger
    manager receives each step's scheduler and iteration stats, and ``tap_engine_steps`` passes them here too,
    in the generating thread (nothing polled, no step missed). Used as ``with tap: llm.generate(...)``; steps
    outside the block (a warm-up, a weight sync) are not counted. ``signal`` is the record, as ``KVCacheWatch``'s."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.preempted: float | None = None
        self.signal: dict[str, float] = {}
        self._on = False

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if not self._on:
            return
        usage, preempted = step_reading(scheduler_stats, iteration_stats)
        if usage is not None:
            self.samples.append(usage)
        if preempted is not None:
            self.preempted = (self.preempted or 0.0) + preempted

    def __enter__(self) -> StepTap:
        self.samples, self.preempted, self.signal, self._on = [], None, {}, True
        return self

    def __exit__(self, *exc) -> None:
        self._on = False
        self.signal = kv_signal(self.samples, None if self.preempted is None else 0.0, self.preempted)


def tap_engine_steps(llm: Any, tap: StepTap) -> bool:
    """Pass every step's stats of ``llm`` (a ``vllm.LLM``) to ``tap`` as well as to its stat loggers, at the one
    call vLLM's V1 ``LLMEngine.step`` makes with them (``llm_engine.logger_manager.record``, present when the engine
    logs stats). False when there is no such call to tap: the caller polls the Prometheus metrics instead."""
    manager = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
    record = getattr(manager, "record", None)
    if not callable(record):
        return False

    def record_and_tap(*args: Any, **kwargs: Any) -> Any:
        scheduler_stats = kwargs.get("scheduler_stats", args[0] if args else None)
        iteration_stats = kwargs.get("iteration_stats", args[1] if len(args) > 1 else None)
        tap.record(scheduler_stats, iteration_stats)
        return record(*args, **kwargs)

    manager.record = record_and_tap
    return True
