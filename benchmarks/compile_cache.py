"""The first step of a compiled probe with a cold and with a warm Inductor cache: the same probe run N times, one
after the other, into one output directory, as the probes of a search are (they share ``<out>/runs/.compile-cache``).

    PYTHONPATH=. python3 benchmarks/compile_cache.py --out $OUT [--recipe qwen2.5-0.5b] [--probes 2] [--steps 5] \
        [--set KEY=VALUE ...]

The cache directory starts empty (``--out`` must be a new directory), so the first probe compiles cold and every
later one finds its graphs. Per probe: the first step's wall time (``timing_s/step`` of step 0, which holds the
compilation), the median of the later steps, the startup before step 0 (from the launch) and its parts, the first
step's compile and CUDA-graph capture, whether Inductor's cache answered, and the cache's size after it. Writes
``compile_cache.json`` (with its date, device and command, for ``collect.py``) and ``compile_cache.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from tunekit.config import load_recipe
from tunekit.launch.probe import run_probe
from tunekit.rundir import COMPILE_CACHE, read_steps
from tunekit.runners import runner_for


BUDGET_MARGIN_S = 15
"""Of ``--budget-s``, what a probe stopped at its timeout takes to end and write its records."""
MIN_PROBE_S = 60
"""No probe starts with less of the budget than this: it could not reach a first step."""
FIXED_COST_KEYS = ("startup/", "first_step/", "compile/", "compile_cache/")
"""The summary's start-up split, first step and compile-cache keys (:mod:`tunekit.profiler.startup`), kept per probe."""


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20 if path.exists() else 0.0


def write(out: Path, rows: list[dict]) -> None:
    """``compile_cache.json`` (with its date, device and command) and ``compile_cache.md`` of the probes so far."""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "command": "python3 benchmarks/compile_cache.py " + shlex.join(sys.argv[1:])}
    (out / "compile_cache.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    head = list(dict.fromkeys(k for r in rows for k in r))
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join("" if r.get(k) is None else f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                             for k in head) + " |" for r in rows]
    (out / "compile_cache.md").write_text("\n".join(md) + "\n")


COMPILED = "system.compile=true"
"""What every probe sets where its runner compiles its training passes: the compile is what this measures."""


def probe_sets(recipe: str | None, steps: int, given: list[str]) -> list[str]:
    """The overrides of every probe: ``steps`` steps with one warm-up, no communication sampling, :data:`COMPILED`
    where the recipe's runner (after ``given``) compiles its training on a GPU with it (verl's never does, and
    refuses it), then ``given``."""
    base = [f"probe.steps={steps}", "probe.warmup_steps=1", "profiler.comm_steps=0"]
    compiled = load_recipe(recipe, [COMPILED, *base, *given])
    compiles = runner_for(compiled).training_path(compiled, gpu=True).get("resolved/compile")
    return ([COMPILED] if compiles else []) + base + given


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--recipe", default=None, help="recipe name or path (default: the embedded model)")
    ap.add_argument("--probes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override added to every probe")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall seconds for all the probes: each probe's timeout is cut to what is left, so a probe "
                         "the budget ends stops as a timeout and keeps its row (its start-up, from startup.json)")
    ap.add_argument("--probe-env", action="append", default=[], metavar="I:NAME=VALUE",
                    help="an environment variable for probe I alone (e.g. 2:TORCHINDUCTOR_COMPILE_THREADS=1), to "
                         "measure what one setting saves on a warm start against the probe before it")
    a = ap.parse_args()
    if a.out.exists() and any(a.out.iterdir()):
        print(f"{a.out} is not empty; give a new directory so that the first probe compiles cold", file=sys.stderr)
        return 2
    runs = a.out / "runs"
    sets = probe_sets(a.recipe, a.steps, a.set)
    probe_env: dict[int, dict[str, str]] = {}
    for item in a.probe_env:
        index, _, assignment = item.partition(":")
        name, _, value = assignment.partition("=")
        probe_env.setdefault(int(index), {})[name] = value
    rows = []
    began = time.monotonic()
    for i in range(a.probes):
        recipe = load_recipe(a.recipe, sets)
        if a.budget_s is not None:
            left = a.budget_s - (time.monotonic() - began) - BUDGET_MARGIN_S
            if left < MIN_PROBE_S:
                print(f"probe {i} not started: {max(left, 0):.0f} s of the budget left", flush=True)
                break
            recipe = load_recipe(a.recipe, [*sets, f"probe.timeout_s={int(min(recipe.probe.timeout_s, left))}"])
        with mock.patch.dict(os.environ, probe_env.get(i, {})):
            result = run_probe(recipe, out=runs, run_id=f"probe{i}")
        steps = read_steps(result.run_dir)
        step_s = steps["timing_s/step"].tolist() if "timing_s/step" in steps else []
        summ = result.summary
        rows.append({"probe": i, "env": " ".join(f"{k}={v}" for k, v in probe_env.get(i, {}).items()) or None,
                     "status": summ["status"], "startup_s": summ.get("startup_s"),
                     "first_step_s": step_s[0] if step_s else None,
                     "later_steps_median_s": float(torch.tensor(step_s[1:]).median()) if len(step_s) > 1 else None,
                     "cache_mb": round(_size_mb(runs / COMPILE_CACHE), 1)}
                    | {k: v for k, v in summ.items() if k.startswith(FIXED_COST_KEYS)})
        print(json.dumps(rows[-1]), flush=True)
        write(a.out, rows)  # after every probe: a run cut short keeps the probes it finished
    if not rows:
        print("no probe fitted the budget", file=sys.stderr)
        return 1
    print((a.out / "compile_cache.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
