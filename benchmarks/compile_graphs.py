"""The graphs torch.compile traces at each step of a probe, and each step's time, on the trainer's compiled path.

Runs a probe's steps in this process, on one rank: the recipe's roles built as a probe builds them (``system.compile``
resolved as on this device, or set), the task's own prompts, so the batch's width changes from step to step as
it does in a probe. After each step it records how many graphs dynamo has traced so far and why it traced again
(dynamo's guard failures, its ``recompiles`` log). A compiled role should trace each of its passes at the first
step and never again; a step that adds graphs pays their compile time.

    PYTHONPATH=. python3 benchmarks/compile_graphs.py --recipe qwen2.5-0.5b --steps 20 --out "$OUT/compile" \
        --set algorithm.name=grpo --set system.batch.prompts_per_step=4 --set system.batch.samples_per_prompt=2 \
        --set system.batch.micro_batch_size=8 --set task.max_new_tokens=4
    PYTHONPATH=. python3 benchmarks/compile_graphs.py --steps 10 --set system.device=cpu --set system.compile=true  # CPU

Writes OUT/compile_graphs.json (every step) and prints one line a step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402


class _Recompiles(logging.Handler):
    """Collects the first line of each of dynamo's recompile messages (what changed, which function)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage().strip()
        self.lines.append(" | ".join(line.strip() for line in msg.splitlines()[:3]))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=None, help="recipe name or file (default: the embedded one)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    return ap.parse_args()


def main() -> int:
    args = parse()
    from torch._dynamo.utils import counters

    from tunekit.config import load_recipe
    from tunekit.dist import init_from_env
    from tunekit.profiler.phases import PhaseTimer
    from tunekit.trainer.build import build_local_roles, build_task, compiles, load_tokenizer
    from tunekit.trainer.loop import Trainer

    from tunekit.errors import ConfigError

    try:
        recipe = load_recipe(args.recipe, args.set)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        return 2
    dist = init_from_env(recipe.system.device)
    torch._logging.set_logs(recompiles=True)
    handler = _Recompiles()
    logging.getLogger("torch._dynamo").addHandler(handler)
    tokenizer, task = load_tokenizer(recipe), build_task(recipe)
    roles = build_local_roles(recipe, dist, tokenizer, task)
    trainer = Trainer(recipe, roles, tokenizer=tokenizer, task=task, dist=dist, timer=PhaseTimer(dist.device))
    rows, before = [], 0
    for step in range(args.steps):
        seen = len(handler.lines)
        start = time.perf_counter()
        trainer.step(step)
        seconds = time.perf_counter() - start
        graphs = counters["stats"]["unique_graphs"]
        row = {"step": step, "seconds": seconds, "graphs": graphs, "new_graphs": graphs - before,
               "recompiles": [line for line in handler.lines[seen:] if "Recompiling" in line]}
        rows.append(row)
        print(f"step {step:3d}  {seconds:8.2f} s  graphs {graphs:3d} (+{row['new_graphs']})", flush=True)
        for line in row["recompiles"]:
            print(f"    {line[:240]}", flush=True)
        before = graphs
    out = {"recipe": args.recipe, "overrides": args.set, "device": str(dist.device),
           "compiled": compiles(recipe, dist), "torch": torch.__version__, "steps": rows,
           "graphs_after_first_step": rows[0]["graphs"] if rows else 0, "graphs": before}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_graphs.json").write_text(json.dumps(out, indent=1))
    print(f"compiled: {out['compiled']}; graphs after step 0: {out['graphs_after_first_step']}, after step "
          f"{args.steps - 1}: {before}; wrote {args.out / 'compile_graphs.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
