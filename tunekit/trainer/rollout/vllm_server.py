"""Rollout on vLLM servers: one per rollout replica that tunekit starts (each on ``system.rollout.tensor_parallel_size``
of the rollout GPUs, ``--tensor-parallel-size`` that many), or one at ``system.rollout.server_url``.

The step's rows split into contiguous shares, one per server.

Generation goes through ``/v1/completions`` with token-id prompts, one request per row
(each with its own seed), sent concurrently so the server batches them; token ids and the
sampled tokens' logprobs come back (``return_token_ids``, ``logprobs=0``; the server skips
its tokenizer). New weights go
to the server after each update through vLLM 0.25's RLHF endpoints (served with
``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config '{"backend":"nccl"}'``):
``/pause`` → ``/start_weight_update`` → ``/update_weights`` per bucket while this process
broadcasts the bucket over NCCL as rank 0 of a group with the server's workers →
``/finish_weight_update`` → ``/resume``.

When weights cannot reach the server (it shares this GPU — NCCL puts no two ranks of a
communicator on one GPU —, it has no RLHF endpoints, the trainer has no CUDA, or the
transfer fails) the probe goes on and ``rollout/staleness_steps`` records how many
actor updates the server's weights are behind: such a probe is off-policy.

While a generation runs, the server's ``/metrics`` page is read for its KV-cache signal
(``rollout/kv_usage_peak``, ``rollout/preemptions``), as the in-process engine's metrics are.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.placement.backends import rollout_shares_trainer_gpus
from tunekit.placement.gpus import visible_devices
from tunekit.placement.ports import free_port
from tunekit.trainer.batch import Batch
from tunekit.trainer.rollout.checkpoint import max_model_len
from tunekit.trainer.rollout.engine_io import (
    BUCKET_BYTES,
    KVCacheWatch,
    Sample,
    bucket_weights,
    build_requests,
    compilation_config,
    most_sequences,
    engine_flags,
    engine_knobs,
    pad_responses,
    prometheus_samples,
)
from tunekit.trainer.rollout.server_process import (
    HTTPStatusError,
    ServerError,
    ServerProcess,
    health_problem,
    http_json,
    http_text,
    start_together,
)
from tunekit.trainer.rollout.vllm_engine import check_vllm_here
from tunekit.trainer.rollout.vllm_weight_push import NcclWeightPush, send_to_all

SERVED_NAME = "tunekit-rollout"
_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def server_command(model_dir: Path, *, port: int, recipe: Recipe, max_len: int, sleep: bool,
                   python: str = sys.executable, token_ids_only: bool = True) -> list[str]:
    """The ``vllm serve`` command line of one rollout replica (tensor parallel over its GPUs). ``token_ids_only``:
    the server skips its tokenizer and takes token-id prompts (a probe's); false: it tokenizes text prompts too
    (a load test's, as a user's client sends them)."""
    rc = recipe.system.rollout
    tp = rc.tensor_parallel_size
    cmd = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", SERVED_NAME, "--dtype", "bfloat16",
           "--gpu-memory-utilization", str(rc.gpu_memory_utilization), "--tensor-parallel-size", str(tp),
           "--max-model-len", str(max_len), "--seed", str(recipe.probe.seed),
           "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
           "--weight-transfer-config", '{"backend":"nccl"}', "--uvicorn-log-level", "warning"]
    # token ids in and out: no text needed, and a preset's vocabulary is larger than the embedded tokenizer's
    cmd += ["--skip-tokenizer-init"] if token_ids_only else []
    cmd += ["--enforce-eager"] if rc.enforce_eager else []
    cmd += engine_flags(engine_knobs(rc))
    if (cc := compilation_config(rc.enforce_eager, rc.torch_compile, most_sequences(recipe))) is not None:
        cmd += ["--compilation-config", json.dumps(cc, separators=(",", ":"))]
    cmd += ["--enable-sleep-mode"] if sleep else []
    cmd += ["--trust-remote-code"] if recipe.model.trust_remote_code else []
    return cmd


def server_env(gpus: list[int], base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: its own GPUs, dev endpoints on, no torchrun variables of the trainer."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if k not in _TORCHRUN_ENV}
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus, env)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def completion_body(tokens: list[int], params: dict, model: str) -> dict:
    """``/v1/completions`` body for one token-id prompt, asking for token ids back."""
    return {"model": model, "prompt": tokens, **params, "return_token_ids": True, "return_tokens_as_token_ids": True}


def parse_completion(resp: dict, *, logprobs: bool = True) -> tuple[list[int], list[float] | None]:
    """(token ids, sampled-token logprobs, or None when ``logprobs`` is false) of the first choice of a
    ``/v1/completions`` answer."""
    choice = resp["choices"][0]
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None and not logprobs:
        raise ServerError("server returned no token_ids; without logprobs tunekit needs a vLLM that honours "
                          "return_token_ids (set system.rollout.logprobs=auto for an older server)")
    if ids is None:  # older servers: tokens come back as "token_id:<id>" strings
        ids = [int(t.rsplit(":", 1)[1]) for t in lp.get("tokens", [])]
    if not logprobs:
        return list(ids), None
    logps = [float(x) for x in lp.get("token_logprobs", [])]
    if len(logps) != len(ids):
        raise ServerError(f"server returned {len(ids)} tokens but {len(logps)} logprobs; it must honour logprobs=0")
    return list(ids), logps


def row_shares(rows: int, servers: int) -> list[int]:
    """How many of a generation's rows each server takes: contiguous shares as even as possible."""
    base, extra = divmod(rows, servers)
    return [base + (i < extra) for i in range(servers)]


@dataclass
class Replica:
    """One server: its URL, the process tunekit started (None for a server given by URL), its weight push."""

    url: str
    server: ServerProcess | None = None
    push: NcclWeightPush | None = None

    def check(self) -> None:
        if self.server is not None:
            self.server.check()


class VLLMServerRollout:
    """Samples responses from vLLM servers; pushes weights to them when it can, else records staleness."""

    @staticmethod
    def preflight(recipe: Recipe, cuda_count: int) -> None:
        """A server at ``server_url`` must answer now (it needs neither vLLM nor a GPU here: weights that cannot be
        pushed to it are recorded as staleness); one tunekit starts needs vLLM and a GPU."""
        rc = recipe.system.rollout
        if not rc.server_url:
            check_vllm_here(recipe, cuda_count)
            return
        problem = health_problem(rc.server_url, timeout_s=5.0)
        if problem:
            raise ConfigError(f"system.rollout.server_url {rc.server_url} does not answer {rc.server_url}/health ({problem}); start the vLLM server or fix the URL.")

    def __init__(self, *, recipe: Recipe, device: torch.device, tokenizer, pad_id: int, eos_id: int,
                 max_new_tokens: int, temperature: float, fixed_length: bool, model_dir: str | Path | None = None,
                 run_dir: str | Path | None = None) -> None:
        self.device, self.pad_id, self.eos_id = device, pad_id, eos_id
        self.max_new_tokens, self.temperature, self.fixed_length = max_new_tokens, temperature, fixed_length
        self.logprobs = recipe.system.rollout.logprobs is not False
        self.rank, self.world = _rank_world()
        rc, sysc = recipe.system.rollout, recipe.system
        shares_gpu = rollout_shares_trainer_gpus(sysc)
        self.sleeps = not rc.server_url and shares_gpu and rc.enable_sleep
        self.replicas: list[Replica] = []
        urls = [rc.server_url] if rc.server_url else None
        if urls is None and self.rank == 0:
            self.replicas = self._start_servers(recipe, Path(model_dir), sysc.rollout_replicas, Path(run_dir or "."))
            urls = [r.url for r in self.replicas]
        elif urls is not None:
            problem = health_problem(urls[0], timeout_s=10.0)
            if problem:
                raise ServerError(f"vLLM server at system.rollout.server_url {urls[0]} does not answer ({problem})")
        urls = _broadcast(urls, self.world)
        self.replicas = self.replicas or [Replica(u) for u in urls]
        self.url = urls[0]
        self.model = self._model_name()
        self.timeout_s = max(600.0, rc.server_timeout_s)
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="vllm-request")
        self.actor_version = self.server_version = 0
        self.push_problem = "weights are pushed by rank 0"
        if self.rank == 0:
            self.push_problem = self._connect_push(shares_gpu, rc.server_url is None)
            if self.push_problem:
                print(f"[tunekit] weights will not reach the vLLM server: {self.push_problem}; "
                      "recording rollout/staleness_steps", file=sys.stderr, flush=True)
        self.last_metrics: dict[str, float] = {"rollout/staleness_steps": 0.0}

    @property
    def push(self) -> bool:
        """Whether new weights reach every server."""
        return bool(self.replicas) and all(r.push is not None for r in self.replicas)

    # ------------------------------------------------------------------ setup

    def _start_servers(self, recipe: Recipe, model_dir: Path, groups: list[list[int]], run_dir: Path) -> list[Replica]:
        """One server per replica, started at once (each waits for its own ``/health``)."""
        replicas = [self._server(recipe, model_dir, gpus, run_dir, name="vllm_server" if i == 0 else f"vllm_server{i}")
                    for i, gpus in enumerate(groups)]
        start_together([r.server for r in replicas], timeout_s=recipe.system.rollout.server_timeout_s)
        return replicas

    def _server(self, recipe: Recipe, model_dir: Path, gpus: list[int], run_dir: Path, *, name: str) -> Replica:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = server_command(model_dir, port=port, recipe=recipe, sleep=self.sleeps,
                             max_len=max_model_len(model_dir, self.max_new_tokens))
        log_path, pgid_path = rundir.server_files(run_dir, name)
        return Replica(url, ServerProcess(cmd, url=url, log_path=log_path, pgid_path=pgid_path, env=server_env(gpus)))

    def _model_name(self) -> str:
        try:
            models = http_json("GET", f"{self.url}/v1/models", timeout=10.0)
            return models["data"][0]["id"]
        except (OSError, HTTPStatusError, KeyError, IndexError, TypeError, ValueError):
            return SERVED_NAME

    def _connect_push(self, shares_gpu: bool, started_here: bool) -> str:
        """Set up the NCCL weight push to every server; returns why it is impossible ('' when it works)."""
        if self.device.type != "cuda":
            return "the trainer has no CUDA device for NCCL"
        if started_here and shares_gpu:
            return "the server shares a GPU with the trainer, and NCCL puts no two ranks of a group on one GPU"
        for r in self.replicas:
            try:
                workers = int(http_json("GET", f"{r.url}/get_world_size", timeout=10.0)["world_size"])
            except HTTPStatusError as e:
                return f"the server has no RLHF endpoints (HTTP {e.status}; serve it with VLLM_SERVER_DEV_MODE=1)"
            except (OSError, KeyError, TypeError, ValueError) as e:
                return f"cannot ask the server for its world size ({e})"
            try:
                r.push = NcclWeightPush(r.url, workers=workers, device=self.device, timeout_s=120.0)
            except Exception as e:  # noqa: BLE001 - any failure means: no push, record staleness
                return f"NCCL weight transfer could not be set up ({type(e).__name__}: {str(e)[:200]})"
        return ""

    def _check_servers(self) -> None:
        for r in self.replicas:
            r.check()

    # ------------------------------------------------------------------ rollout interface

    def generate(self, prompts: Batch, *, seed: int, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample one response per prompt row (``greedy``: the most likely one, temperature 0). Returns (response_ids [B,R], logprobs [B,R] or None when
        ``system.rollout.logprobs`` is false), R = max_new_tokens."""
        rows, params = build_requests(prompts, seed=seed, temperature=0.0 if greedy else self.temperature,
                                      max_new_tokens=self.max_new_tokens, fixed_length=self.fixed_length,
                                      eos_id=self.eos_id, logprobs=self.logprobs)
        urls = [f"{r.url}/v1/completions" for r, n in zip(self.replicas, row_shares(len(rows), len(self.replicas)))
                for _ in range(n)]
        with KVCacheWatch(self.engine_metrics, interval_s=0.2) as watch:
            futures = [self.pool.submit(http_json, "POST", url, completion_body(r, p, self.model), timeout=self.timeout_s)
                       for url, r, p in zip(urls, rows, params)]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=1.0)
                self._check_servers()
        try:
            parsed = [parse_completion(f.result(), logprobs=self.logprobs) for f in futures]
        except (OSError, HTTPStatusError) as e:
            self._check_servers()
            raise ServerError(f"vLLM server at {self.url} failed a generation request ({e})") from None
        self.last_metrics = {"rollout/staleness_steps": float(self.actor_version - self.server_version)} | watch.signal
        return pad_responses([t for t, _ in parsed], [lp for _, lp in parsed] if self.logprobs else None,
                             length=self.max_new_tokens, pad_id=self.pad_id)

    def engine_metrics(self) -> list[Sample]:
        """The servers' Prometheus metrics (their ``/metrics`` pages); none from a server that does not answer in
        time."""
        out: list[Sample] = []
        for r in self.replicas:
            try:
                out += prometheus_samples(http_text(f"{r.url}/metrics", timeout=5.0))
            except (OSError, HTTPStatusError, ValueError):
                pass
        return out

    def sync_weights(self, named_params) -> int:
        """Push the actor's new weights to every server; returns bytes sent (0 when they cannot be pushed).

        Every rank iterates ``named_params`` (the FSDP gather is a collective); rank 0 sends each bucket to each
        server in turn.
        """
        self.actor_version += 1
        moved = 0
        if self.push:
            pushes = [r.push for r in self.replicas]
            try:
                moved = send_to_all(pushes, bucket_weights(named_params, bucket_bytes=BUCKET_BYTES, dtype=torch.bfloat16))
                self.server_version = self.actor_version
            except Exception as e:  # noqa: BLE001 - a failed push leaves the server stale, not the probe dead
                self._check_servers()
                for r in self.replicas:
                    r.push = None
                print(f"[tunekit] weight push to the vLLM server failed ({type(e).__name__}: {str(e)[:300]}); "
                      "recording rollout/staleness_steps from now on", file=sys.stderr, flush=True)
        for _ in named_params:  # what a failed or absent push left: the other ranks gather it too
            pass
        self.server_version = _broadcast(self.server_version, self.world)
        return moved

    def sleep(self) -> None:
        """Free the servers' GPU memory while training runs (only servers tunekit started on these GPUs)."""
        if self.sleeps and self.rank == 0:
            self._post("/sleep?level=1")

    def wake(self) -> None:
        if self.sleeps and self.rank == 0:
            self._post("/wake_up")

    def _post(self, path: str) -> None:
        for r in self.replicas:
            try:
                http_json("POST", f"{r.url}{path}", timeout=self.timeout_s)
            except (OSError, HTTPStatusError) as e:
                r.check()  # a dead server says so with its log
                raise ServerError(f"vLLM server at {r.url} failed {path} ({e})") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for r in self.replicas:
            if r.server is not None:
                r.server.stop()


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _broadcast(value, world: int):
    """Rank 0's ``value`` on every rank (also a barrier)."""
    if world == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


