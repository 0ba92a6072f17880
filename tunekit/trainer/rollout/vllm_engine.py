"""Rollout with an in-process vLLM engine (``vllm.LLM``) that shares the training process and its GPU.

Placement (``system.rollout.tensor_parallel_size`` = TP GPUs per engine):

- spmd (torchrun): the engine joins the ranks' existing process group through vLLM's
  ``external_launcher`` executor instead of starting its own, which also keeps the engine in
  this process, so weights load by direct call. With TP 1 every rank owns an engine on its own
  GPU and generates its shard of the batch (data-parallel rollout); with TP > 1 each block of TP
  consecutive ranks holds one engine, a shard of it per rank, and generates the block's prompts
  together (:mod:`~tunekit.trainer.rollout.engine_group`).
- a single-controller rollout worker holds the TP GPUs of one replica; with TP > 1 vLLM runs its
  workers in child processes (the ``mp`` executor) and weight buckets travel to them through
  ``collective_rpc`` (on CPU, slower).

Weight sync gathers the actor's full parameters one at a time, groups them into ~256 MB
buckets in the engine's dtype and calls the engine model's ``load_weights`` (which takes
Hugging Face names) per bucket. Logprobs are vLLM's ``processed_logprobs``: after
temperature, the distribution the actor's recomputed logprobs use.

Asleep, the engine holds no GPU memory: at ``sleep_level`` 2 its weights are dropped, since the
actor's are loaded into it after every wake anyway (level 1 parks them in pinned host memory, a
copy each way). Waking empties training's allocator cache only when the engine would not fit
beside it, so the next update does not have to allocate its memory afresh.

Each generation records the engine's KV-cache signal: ``rollout/kv_usage_peak`` (the fullest its cache was, 0 to
1: near 1 the engine is memory-starved, far below it the pool is oversized) and ``rollout/preemptions`` (requests
evicted and recomputed for lack of cache). They come from the stats the engine hands its stat loggers at every
step (``StepTap``); where this vLLM offers no such hand-over, or a generation passed none, from its Prometheus
metrics (``LLM.get_metrics``) polled while it generates.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.placement.gpus import on_gpu
from tunekit.trainer.batch import Batch
from tunekit.trainer.rollout.checkpoint import max_model_len
from tunekit.trainer.rollout.engine_group import EngineGroup, own_rows
from tunekit.trainer.rollout.engine_io import (
    BUCKET_BYTES,
    KVCacheWatch,
    StepTap,
    bucket_weights,
    build_requests,
    compilation_config,
    most_sequences,
    engine_knobs,
    pad_responses,
    sampled_logprobs,
    tap_engine_steps,
    tensor_bytes,
)

ENGINE_DTYPE = torch.bfloat16


def _load_bucket(bucket: list[tuple[str, torch.Tensor]], model: torch.nn.Module) -> None:
    model.load_weights(bucket)


def check_vllm_here(recipe: Recipe, cuda_count: int) -> None:
    """An engine tunekit runs here needs vLLM installed and a GPU."""
    backend = recipe.system.rollout.backend
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"system.rollout.backend={backend} needs vLLM, which is not installed; run `pip install -e \".[vllm]\"` on a GPU machine or use backend hf.")
    if not on_gpu(recipe.system.device, cuda_count):
        raise ConfigError(f"system.rollout.backend={backend} needs an NVIDIA GPU and this probe runs on CPU; use backend hf on CPU.")



COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""Where Inductor and Triton keep their caches, read from the environment at every lookup."""


@contextlib.contextmanager
def _compile_cache_env_kept() -> Iterator[None]:
    """The process's compile-cache directories as they were before the block. An engine that compiles points them
    into its own directory, one per engine configuration, and leaves them there: the trainer's graphs compiled
    afterwards would follow, and a later probe whose engine settings differ would compile them cold again. Back in
    the probe's shared directory (:func:`tunekit.runners.base.compile_cache_env`), every probe of the search finds
    them."""
    saved = {name: os.environ.get(name) for name in COMPILE_CACHE_ENV}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

class VLLMRollout:
    """Samples responses with an in-process ``vllm.LLM``; sleeps while training runs when colocated."""

    preflight = staticmethod(check_vllm_here)

    def __init__(self, *, recipe: Recipe, device: torch.device, tokenizer, model_dir: str | Path, pad_id: int,
                 eos_id: int, max_new_tokens: int, temperature: float, fixed_length: bool,
                 engine_args: dict | None = None) -> None:
        """``engine_args``: further ``vllm.LLM`` arguments, over the recipe's (e.g. ``num_gpu_blocks_override``, a
        KV cache of a known size)."""
        self.device, self.pad_id, self.eos_id = device, pad_id, eos_id
        self.max_new_tokens, self.temperature, self.fixed_length = max_new_tokens, temperature, fixed_length
        rc = recipe.system.rollout
        self.enable_sleep, self.sleep_level = rc.enable_sleep, rc.sleep_level
        self.logprobs = rc.logprobs is not False
        self.asleep = False
        self.released_bytes = 0  # what the engine gave back when it fell asleep: what waking takes again
        self.last_metrics: dict[str, float] = {"rollout/staleness_steps": 0.0}
        in_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        tp = rc.tensor_parallel_size
        self.remote_workers = tp > 1 and not in_group
        # the ranks sharing this engine (spmd, TP > 1) submit one set of requests; made before the engine's groups
        self.group = EngineGroup(tp) if tp > 1 and in_group else None
        self.llm = self._make_engine(recipe, Path(model_dir), tp, in_group, dict(engine_args or {}))
        tap = StepTap()
        self.step_tap: StepTap | None = tap if tap_engine_steps(self.llm, tap) else None

    def _make_engine(self, recipe: Recipe, model_dir: Path, tp: int, in_group: bool, extra: dict):
        rc = recipe.system.rollout
        # in-process engine core (its model is reachable), and no flashinfer sampler (not installed everywhere)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        kwargs = engine_knobs(rc)
        if self.remote_workers:
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc ships the load function
            # the engine's workers in child processes on this process's GPUs (inside a Ray actor too)
            kwargs["distributed_executor_backend"] = "mp"
        if (cc := compilation_config(rc.enforce_eager, rc.torch_compile, most_sequences(recipe))) is not None:
            kwargs["compilation_config"] = cc
        if in_group:
            # join the ranks' process group (external DP x TP, TP consecutive ranks) rather than creating a new one
            os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(torch.distributed.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", str(self.device.index or 0))
            kwargs["distributed_executor_backend"] = "external_launcher"
        from vllm import LLM

        args = {
            "model": str(model_dir), "dtype": "bfloat16", "skip_tokenizer_init": True, "seed": recipe.probe.seed,
            "tensor_parallel_size": tp, "gpu_memory_utilization": rc.gpu_memory_utilization,
            "enable_sleep_mode": rc.enable_sleep, "enforce_eager": rc.enforce_eager,
            "max_model_len": max_model_len(model_dir, self.max_new_tokens), "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm", "trust_remote_code": recipe.model.trust_remote_code,
            "disable_log_stats": False,  # the engine's per-step stats feed the KV-cache signal
        }
        with _compile_cache_env_kept():
            return LLM(**(args | kwargs | extra))

    @torch.no_grad()
    def generate(self, prompts: Batch, *, seed: int, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample one response per prompt row (``greedy``: the most likely one, temperature 0). Returns (response_ids [B,R], logprobs [B,R] or None when
        ``system.rollout.logprobs`` is false), R = max_new_tokens."""
        from vllm import SamplingParams

        rows, params = build_requests(prompts, seed=seed, temperature=0.0 if greedy else self.temperature,
                                      max_new_tokens=self.max_new_tokens, fixed_length=self.fixed_length,
                                      eos_id=self.eos_id, logprobs=self.logprobs)
        requests, counts = list(zip(rows, params)), [len(rows)]
        if self.group is not None:  # the engine's ranks run the same requests: all of theirs
            requests, counts = self.group.gather(requests)
        watch = self.step_tap or KVCacheWatch(self.llm.get_metrics)
        with watch:
            outs = self.llm.generate([{"prompt_token_ids": r} for r, _ in requests],
                                     [SamplingParams(**p, detokenize=False) for _, p in requests], use_tqdm=False)
        self.last_metrics |= watch.signal
        if watch is self.step_tap and "rollout/kv_usage_peak" not in watch.signal:
            self.step_tap = None  # the engine handed no stats over: poll its metrics from the next generation on
        outs = own_rows(outs, counts, self.group.index if self.group is not None else 0)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logps = ([sampled_logprobs(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs] if self.logprobs
                 else None)
        return pad_responses(tokens, logps, length=self.max_new_tokens, pad_id=self.pad_id)

    def sync_weights(self, named_params) -> int:
        """Load the actor's new weights into the engine bucket by bucket; returns bytes moved.

        Every rank iterates ``named_params`` (the FSDP gather is a collective) and loads the full weights into its
        own engine, or its shard of one: vLLM's ``load_weights`` keeps the rank's slice of each tensor.
        """
        moved = 0
        for bucket in bucket_weights(named_params, bucket_bytes=BUCKET_BYTES, dtype=ENGINE_DTYPE):
            if self.remote_workers:
                bucket = [(n, t.cpu()) for n, t in bucket]
            self.llm.apply_model(partial(_load_bucket, bucket))
            moved += sum(tensor_bytes(t) for _, t in bucket)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        return moved

    def sleep(self) -> None:
        """Free the engine's GPU memory for training: KV cache dropped, weights dropped (level 2) or to CPU."""
        if self.enable_sleep and not self.asleep:
            free_before = free_device_bytes(self.device)
            self.llm.sleep(level=self.sleep_level)
            if free_before is not None:
                self.released_bytes = max(0, free_device_bytes(self.device) - free_before)
            self.asleep = True

    def wake(self) -> None:
        """Bring weights and KV cache back before the weight sync and the next generation."""
        if self.asleep:
            free = free_device_bytes(self.device)
            if free is not None and must_empty_cache(free, self.released_bytes):
                torch.cuda.empty_cache()  # return training's cached blocks so the engine's pools fit
            self.llm.wake_up()
            self.asleep = False


WAKE_HEADROOM_BYTES = 1024**3
"""Free memory kept beyond what a waking engine takes back, for what it allocates outside its pools."""


def must_empty_cache(free_bytes: int, wake_bytes: int) -> bool:
    """Whether training's cached blocks must go back to the driver before the engine wakes: only when the
    memory free now would not hold what the engine released when it fell asleep, plus headroom."""
    return free_bytes < wake_bytes + WAKE_HEADROOM_BYTES


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` as the driver sees it (None off CUDA)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]

