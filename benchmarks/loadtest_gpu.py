"""Load tests of the recipe's own rollout engine on one GPU, each measured twice on the same server: by tunekit's
HTTP client and by vLLM's own ``vllm bench serve``, with the same prompts, levels and sampling.

For each model and ``system.rollout.max_num_seqs`` setting, tunekit starts the recipe's ``vllm serve``
(:func:`tunekit.loadtest.target.open_target`, as ``tunekit loadtest`` without ``--url`` does), then runs
``tunekit loadtest``'s sweep at its URL with ``loadtest.client=http`` (every level) and with
``loadtest.client=vllm_bench`` (the pass line's two levels, 1 and ``loadtest.at_concurrency``: vLLM's client is a
process of its own per level, tens of seconds to start), and stops the server. ``loadtest_gpu.json`` holds, per configuration, both sweeps' rows and the ratio of tunekit's
figures to vLLM's at each level (1.0: the same).

    python3 benchmarks/loadtest_gpu.py OUT --config NAME RECIPE_OR_NONE SET... [--config ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tunekit.config import load_recipe
from tunekit.loadtest import run_loadtest
from tunekit.loadtest.target import open_target
from tunekit.workload.pretrained import resolve_model

COMPARED = ("qps", "tokens_per_s", "latency_ms_p50", "latency_ms_p95", "ttft_ms_p50")
KEPT = ("concurrency", "requests", "failed", *COMPARED, "latency_ms_p99", "pass", "error")


def _ratios(ours: list[dict], theirs: list[dict]) -> list[dict]:
    by_level = {r["concurrency"]: r for r in theirs}
    out = []
    for row in ours:
        other = by_level.get(row["concurrency"])
        if other is None:
            continue
        out.append({"concurrency": row["concurrency"],
                    **{k: round(row[k] / other[k], 3) if row.get(k) and other.get(k) else None for k in COMPARED}})
    return out


def run_config(name: str, ref: str | None, sets: list[str], out: Path, deadline: float) -> dict:
    recipe = resolve_model(load_recipe(ref, sets))  # a pretrained preset: its converted checkpoint
    where = out / name
    where.mkdir(parents=True, exist_ok=True)
    entry: dict = {"name": name, "recipe": ref, "sets": sets, "max_num_seqs": recipe.system.rollout.max_num_seqs}
    t0 = time.perf_counter()
    with open_target(recipe, out_dir=where, max_tokens=recipe.loadtest.max_tokens or recipe.task.max_new_tokens) as target:
        entry["server_start_s"] = round(time.perf_counter() - t0, 1)
        for client in ("http", "vllm_bench"):
            if time.monotonic() > deadline:
                entry[client] = {"skipped": "time budget spent"}
                continue
            # vLLM's client starts a process per level: it measures the pass line's two levels (1 and at_concurrency)
            levels = ["loadtest.concurrency=[1]"] if client == "vllm_bench" else []
            r = load_recipe(ref, [*sets, *levels, f"loadtest.url={target.endpoint.url}", f"loadtest.client={client}"])
            t1 = time.perf_counter()
            try:
                test = run_loadtest(r, out_dir=where / client)
                entry[client] = {"wall_s": round(time.perf_counter() - t1, 1), "pass": test.passed,
                                 "verdict": test.verdict(), "stopped": test.stopped,
                                 "rows": [{k: row.get(k) for k in KEPT} for row in test.rows]}
            except Exception as e:  # noqa: BLE001 - one failed sweep is a row of the results, not the end of the run
                entry[client] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    if "rows" in entry.get("http", {}) and "rows" in entry.get("vllm_bench", {}):
        entry["tunekit_over_vllm"] = _ratios(entry["http"]["rows"], entry["vllm_bench"]["rows"])
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--config", nargs="+", action="append", required=True,
                    help="NAME RECIPE (or none) then --set values as key=value")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no sweep after this many seconds")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    results: dict = {"configs": []}
    try:
        import torch
        import vllm

        results["gpu"] = torch.cuda.get_device_name(0)
        results["vllm"] = vllm.__version__
    except Exception as e:  # noqa: BLE001
        results["env_error"] = str(e)[:200]
    for name, ref, *sets in args.config:
        if time.monotonic() > deadline:
            results["configs"].append({"name": name, "skipped": "time budget spent"})
            continue
        try:
            results["configs"].append(run_config(name, None if ref == "none" else ref, sets, out, deadline))
        except Exception as e:  # noqa: BLE001
            results["configs"].append({"name": name, "error": f"{type(e).__name__}: {str(e)[:400]}"})
        (out / "loadtest_gpu.json").write_text(json.dumps(results, indent=1))
        print(json.dumps(results["configs"][-1])[:2000], flush=True)


if __name__ == "__main__":
    main()
