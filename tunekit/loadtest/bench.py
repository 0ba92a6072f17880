"""One level of a load test through vLLM's own client, ``vllm bench serve``, and its JSON result read back.

It runs as ``python -m vllm.entrypoints.cli.main bench serve`` (the module behind the ``vllm`` command) against the
target's ``/v1/completions``, with the load test's prompts as its custom dataset (already rendered, so its chat
template is skipped), every request sent at once (``--request-rate inf``) and ``--max-concurrency`` in flight. It
always streams, so its rows carry the time to first token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tunekit.loadtest.client import Endpoint, Sampling
from tunekit.loadtest.results import PERCENTILES, failed_sentence

BENCH_MODULE = "vllm.entrypoints.cli.main"


BENCH_NEEDS = ("vllm", "datasets")
"""What ``vllm bench serve`` imports before it sends a request: vLLM, and Hugging Face's ``datasets`` (its dataset
loaders import it at start)."""


def available() -> bool:
    """Whether vLLM's benchmark client can run here."""
    return all(importlib.util.find_spec(name) is not None for name in BENCH_NEEDS)


def skip_template_flag() -> str:
    """The custom dataset's flag that sends the prompts as they are: ``--custom-skip-chat-template`` where the
    installed vLLM's benchmark client defines it, else its later name ``--skip-chat-template`` (read from the
    client's own argument definitions, without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    root = Path(spec.origin).parent / "benchmarks" if spec is not None and spec.origin else None
    if root is not None and any('"--custom-skip-chat-template"' in p.read_text(errors="ignore") for p in root.rglob("*.py")):
        return "--custom-skip-chat-template"
    return "--skip-chat-template"


def write_dataset(path: Path, prompts: list[str]) -> Path:
    """The prompts as the custom dataset ``vllm bench serve`` reads: one ``{"prompt": text}`` a line."""
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def bench_command(endpoint: Endpoint, sampling: Sampling, *, dataset: Path, tokenizer: str, concurrency: int,
                  requests: int, warmup: int, result: Path, seed: int, timeout_s: float,
                  python: str = sys.executable) -> list[str]:
    """The ``vllm bench serve`` command line of one level."""
    cmd = [python, "-m", BENCH_MODULE, "bench", "serve", "--backend", "openai", "--base-url", endpoint.url,
           "--endpoint", "/v1/completions", "--model", endpoint.model, "--tokenizer", tokenizer,
           "--dataset-name", "custom", "--dataset-path", str(dataset), skip_template_flag(),
           "--custom-output-len", str(sampling.max_tokens), "--temperature", str(sampling.temperature),
           "--num-prompts", str(requests), "--max-concurrency", str(concurrency), "--request-rate", "inf",
           "--num-warmups", str(warmup), "--seed", str(seed),
           "--percentile-metrics", "ttft,e2el", "--metric-percentiles", ",".join(str(q) for q in PERCENTILES),
           "--ready-check-timeout-sec", str(max(1, int(timeout_s))), "--disable-tqdm",
           "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    return cmd + (["--ignore-eos"] if sampling.ignore_eos else [])


def bench_row(concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    """A load-test row from ``vllm bench serve``'s result JSON (its own key names)."""
    done, failed = int(result.get("completed") or 0), int(result.get("failed") or 0)

    def ms(key: str) -> float | None:
        return float(result[key]) if done and result.get(key) is not None else None

    row: dict[str, Any] = {"concurrency": concurrency, "requests": done + failed, "failed": failed,
                           "qps": float(result["request_throughput"]) if done else None,
                           "tokens_per_s": float(result["output_throughput"]) if done else None}
    row.update({f"latency_ms_p{q}": ms(f"p{q}_e2el_ms") for q in PERCENTILES})
    row["ttft_ms_p50"] = ms("p50_ttft_ms")
    row["error"] = failed_sentence(failed, done + failed, None) + " (vllm bench serve)" if failed else None
    return row


def run_bench_level(endpoint: Endpoint, sampling: Sampling, *, dataset: Path, tokenizer: str, concurrency: int,
                    requests: int, warmup: int, out_dir: Path, seed: int, timeout_s: float) -> dict[str, Any]:
    """Run one level through ``vllm bench serve``; its output goes to ``bench-c<N>.log`` beside the result. A run
    that fails gives a row of failed requests saying why."""
    result = out_dir / f"bench-c{concurrency}.json"
    log = out_dir / f"bench-c{concurrency}.log"
    cmd = bench_command(endpoint, sampling, dataset=dataset, tokenizer=tokenizer, concurrency=concurrency,
                        requests=requests, warmup=warmup, result=result, seed=seed, timeout_s=timeout_s)
    env = dict(os.environ)
    env.pop("OPENAI_API_KEY", None)
    if endpoint.api_key:
        env["OPENAI_API_KEY"] = endpoint.api_key  # where vLLM's client reads the bearer token
    limit = timeout_s * (requests + warmup) / concurrency + 120.0  # every request at its timeout, plus start-up
    with log.open("wb") as out:
        try:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = None
    if code == 0 and result.exists():
        return bench_row(concurrency, json.loads(result.read_text()))
    tail = " | ".join(ln.strip() for ln in log.read_text(errors="replace").splitlines()[-3:] if ln.strip())[-300:]
    why = f"ran past {limit:.0f} s" if code is None else f"exited with code {code}"
    return {"concurrency": concurrency, "requests": requests, "failed": requests, "qps": None, "tokens_per_s": None,
            **{f"latency_ms_p{q}": None for q in PERCENTILES}, "ttft_ms_p50": None,
            "error": f"vllm bench serve {why} (log {log}: {tail or 'empty'})"}
