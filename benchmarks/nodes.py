"""Two nodes simulated on one host vs one node, same GPUs, same probe: step time and exposed communication.

One probe shape (Qwen2.5-0.5B preset, random init; GRPO, 16 prompts x 4 samples, 32 fixed new tokens; hf
rollout; 8 steps, the last two profiled for communication) on every role on GPUs [0, 1], run by
``tunekit.launch.probe.run_probe`` in its own process tree, one after the other:

- ``spmd_1node``: one torchrun of 2 ranks; ``spmd_2nodes``: two torchruns (``system.nnodes=2``,
  ``system.simulate_nodes``), one GPU each, meeting on loopback;
- ``single_1node``: one local Ray cluster; ``single_2nodes``: a Ray head and a second Ray node, one GPU each;
- ``spmd_2nodes_net``: as ``spmd_2nodes`` with ``system.simulate_network`` (each node its own NCCL host id, so
  NCCL crosses between them over its network transport instead of NVLink).

Writes ``OUT/nodes.json`` (compact, for ``benchmarks/collect.py``) and the run directories under ``OUT/runs``.

    PYTHONPATH=. python3 benchmarks/nodes.py --out "$OUT/nodes"
    PYTHONPATH=. python3 benchmarks/nodes.py --out nodes-out --tiny     # CPU check: the embedded tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tunekit.config import ROLES  # noqa: E402

STEPS, COMM_STEPS = 8, 2
COMMON = [f"probe.steps={STEPS}", "probe.warmup_steps=2", f"profiler.comm_steps={COMM_STEPS}", "probe.seed=0",
          "algorithm.name=grpo", "system.batch.prompts_per_step=16", "system.batch.samples_per_prompt=4",
          "system.batch.micro_batch_size=16", "system.rollout.backend=hf"]
GPU = ["task.max_new_tokens=32", "task.fixed_length=true"]
TINY = ["system.device=cpu", "system.batch.prompts_per_step=4", "system.batch.samples_per_prompt=2",
        "system.batch.micro_batch_size=4"]
TWO = [f"system.device_map.{r}=[0,1]" for r in ROLES]
NODES = ["system.nnodes=2", "system.simulate_nodes=true"]
SINGLE = ["system.controller=single"]
CONFIGS = {  # in the order they run: the pairs first, so a spent budget drops the extra one
    "spmd_1node": [],
    "spmd_2nodes": NODES,
    "single_1node": SINGLE,
    "single_2nodes": SINGLE + NODES,
    "spmd_2nodes_net": NODES + ["system.simulate_network=true"],
}


def comm_by_node(steady: dict) -> dict:
    """Communication of the profiled steps, summed over phases: the whole probe's rank 0, and per node."""
    out: dict = {}
    for key, value in steady.items():
        parts = key.split("/")  # comm/<what>/<phase> or comm/node<N>/<what>/<phase>
        if parts[0] != "comm" or len(parts) < 3 or value is None:
            continue
        node, what = (parts[1], parts[2]) if parts[1].startswith("node") else ("rank0", parts[1])
        if what in ("exposed_s", "total_s", "wait_s"):
            out.setdefault(node, {}).setdefault(what, 0.0)
            out[node][what] += float(value)
    return out


def row(result) -> dict:
    s = result.summary
    steady = s.get("steady") or {}
    out = {"status": s["status"], "reason": s.get("reason", "")[:300], "steps": s.get("steps"),
           "startup_s": s.get("startup_s"), "wall_s": s.get("wall_s"), "step_s": steady.get("timing_s/step"),
           "update_actor_s": steady.get("timing_s/update_actor"), "gen_s": steady.get("timing_s/gen"),
           "update_weights_s": steady.get("timing_s/update_weights"), "reward_last": s.get("reward_last10"),
           "comm": comm_by_node(steady), "comm_method": s.get("comm/method")}
    out["nvml"] = {k.removeprefix("nvml/"): v for k, v in s.items()
                   if k.startswith(("nvml/mem_used_gb/", "nvml/node", "nvml/util_mean/")) or k == "nvml/energy_j"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")) / "nodes")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model on CPU ranks (checks the script)")
    ap.add_argument("--timeout", type=float, default=110.0, help="seconds per probe at most")
    ap.add_argument("--budget", type=float, default=225.0, help="seconds for all probes; none starts once it is spent")
    ap.add_argument("--only", nargs="*", help="run only these configs")
    args = ap.parse_args()

    import torch

    from tunekit.config import load_recipe
    from tunekit.launch.probe import run_probe

    if not args.tiny and torch.cuda.device_count() < 2:
        print("nodes: needs 2 GPUs (one per simulated node); use --tiny for the CPU check.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    base = (None, COMMON + TINY + TWO) if args.tiny else ("qwen2.5-0.5b", COMMON + GPU + TWO)
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": "cpu" if args.tiny else torch.cuda.get_device_name(0),
            "torch": torch.__version__, "recipe": base[0] or "embedded tiny", "overrides": " ".join(base[1]),
            "command": "PYTHONPATH=. python3 benchmarks/nodes.py --out $OUT/nodes" + (" --tiny" if args.tiny else "")}
    rows: dict[str, dict] = {}
    t0 = time.monotonic()
    for name, sets in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        left = args.budget - (time.monotonic() - t0)
        if left < 45:
            rows[name] = {"status": "skipped", "reason": f"benchmark budget ({args.budget:g} s) spent"}
            continue
        recipe = load_recipe(base[0], base[1] + sets + [f"probe.timeout_s={min(args.timeout, left)}"])
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {' '.join(sets)}", flush=True)
        result = run_probe(recipe, out=args.out / "runs", run_id=f"{name}-{time.strftime('%H%M%S')}")
        rows[name] = row(result) | {"sets": " ".join(sets)}
        r = rows[name]
        print(f"[{time.monotonic() - t0:5.0f}s] {name}: {r['status']} step={r['step_s']} comm={r['comm']} "
              f"{r['reason'][:200]}", flush=True)
        meta["total_s"] = round(time.monotonic() - t0, 1)
        # rewritten after every probe: a run cut short still leaves what it measured
        (args.out / "nodes.json").write_text(json.dumps({"meta": meta, "rows": rows}, separators=(",", ":"), default=str))
    return 0 if all(r["status"] == "ok" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
