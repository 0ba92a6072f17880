"""Learning curves of SmolLM2-135M-Instruct on the shipped arithmetic task: recipes/smollm2-arith.yaml probed by
tunekit's trainer, by TRL's GRPOTrainer and by verl's PPO trainer (vLLM colocated in each), the same model, dataset,
reward, group size and completion length, for each seed; the probes run at once on one GPU. The curve is the exact-answer rate: the
recipe's reward is 1 for the right final number, else 0, so ``reward/mean`` of a step is its share of right answers.

    python3 benchmarks/smollm2_curves.py --out "$OUT" --runs "$RUNS"
    python3 benchmarks/smollm2_curves.py --out "$OUT" --runs "$RUNS" --seeds 1      # another seed, a later command
    python3 benchmarks/smollm2_curves.py --out "$OUT" --runs "$RUNS" --runners verl  # in verl's environment
    python3 benchmarks/smollm2_curves.py --out "$OUT" --runs "$RUNS" --collect      # the summary of probes run before
    python3 benchmarks/smollm2_curves.py --out "$OUT" --prepare                     # only the model and dataset

The model is converted and the dataset written once before the probes start (into tunekit's cache). Only
``system.rollout.gpu_memory_utilization`` is set below the recipe's so that the probes share the card, and
``system.rollout.enable_sleep`` is off when several probes share it: an engine that sleeps and wakes every step frees
and takes back memory while a neighbour's engine measures the card's free memory at its start, and vLLM then refuses
to start (both are systems knobs: they change where memory goes, not what is learnt); ``probe.timeout_s`` keeps the whole run inside
``--budget-s``: a probe stopped there keeps the steps it finished. Writes OUT/runs/<runner>-s<seed>/<run id>/ (each
probe's run directory: steps.parquet, samples.parquet, summary.json, log.txt), OUT/smollm2_curves.json (per probe: status,
the exact-answer rate and response length of every step, the first and last ten steps' means, start-up and steady
step time; per runner: the mean curve over seeds) and OUT/smollm2_curves.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

RECIPE = "smollm2-arith"
RUNNERS = ("builtin", "trl", "verl")
DEFAULT_RUNNERS = ("builtin", "trl")
"""verl runs in an environment of its own (``pip install -e ".[vllm,verl]"``): a command of its own, ``--runners verl``."""
RUNNER_SETS = {"verl": ["system.controller=single"]}
"""What a runner needs beyond the recipe: verl is a single controller (a Ray driver and its worker groups)."""
SHARED_UTILIZATION = 0.4
"""The card's share all the probes' vLLM engines hold together: the 135M model's weights and the KV cache of 512
sequences of under 600 tokens take about 2 GiB an engine, and each probe's trainer holds about 25 GiB beside it
(``tunekit estimate --recipe smollm2-arith --gpu-profile h200``), so two probes fit a 141 GiB card with room to spare;
more than three do not, so run further seeds as further commands into the same OUT."""
STAGGER_S = 15.0
"""Between probe starts: vLLM measures the card's free memory while it starts, and a neighbour starting at the same
moment moves it."""


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(DEFAULT_RUNNERS))
    ap.add_argument("--runs", default=None,
                    help="where the probes run (their compile caches stay there); default OUT/runs. Elsewhere, each run "
                         "directory's files are copied to OUT/runs/<runner>-s<seed>/<run id>/")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=520.0, help="the whole run, probes and summary, in seconds")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="each probe's vLLM share of the card; default: 0.4 / the number of probes (at most the recipe's)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="one more --set for every probe")
    ap.add_argument("--collect", action="store_true", help="only summarise the probes already in OUT/runs")
    ap.add_argument("--prepare", action="store_true",
                    help="only convert the model and write the dataset (an earlier command's spare time)")
    return ap.parse_args()


def prepare() -> None:
    """The converted model and the generated dataset, made once before the probes share them."""
    from tunekit.config import load_recipe
    from tunekit.workload.pretrained import resolve_model
    from tunekit.workload.shipped import dataset_file

    recipe = resolve_model(load_recipe(RECIPE))
    print(f"model: {recipe.model.path}\ndataset: {dataset_file(recipe.task.dataset)}", flush=True)


def launch(args: argparse.Namespace, out: Path, t0: float) -> dict[str, subprocess.Popen]:
    jobs = [(r, s) for s in args.seeds for r in args.runners]
    util = args.gpu_memory_utilization or min(0.3, SHARED_UTILIZATION / len(jobs))
    procs: dict[str, subprocess.Popen] = {}
    for i, (runner, seed) in enumerate(jobs):
        name = f"{runner}-s{seed}"
        left = args.budget_s - (time.monotonic() - t0) - 40  # the summary and a killed tree's clean-up
        shared = ["--set", "system.rollout.enable_sleep=false"] if len(jobs) > 1 else []
        cmd = [sys.executable, "-m", "tunekit", "probe", "--recipe", RECIPE, "--runner", runner, "--seed", str(seed),
               "--steps", str(args.steps), "--out", str(runs_dir(args, out) / name),
               "--set", f"system.rollout.gpu_memory_utilization={util:.3f}", *shared,
               "--set", f"probe.timeout_s={max(left, 60):.0f}",
               *[x for s in RUNNER_SETS.get(runner, []) + args.sets for x in ("--set", s)]]
        print(" ".join(cmd), flush=True)
        log = (out / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        if i < len(jobs) - 1:
            time.sleep(STAGGER_S)
    return procs


def runs_dir(args: argparse.Namespace, out: Path) -> Path:
    return Path(args.runs).resolve() if args.runs else out / "runs"


def keep(runs: Path, out: Path) -> None:
    """Each run directory's own files (not the compile caches beside them) under OUT/runs."""
    import shutil

    for run in runs.glob("*/*"):
        if run.is_dir() and (run / "config.yaml").is_file():
            dest = out / "runs" / run.parent.name / run.name
            dest.mkdir(parents=True, exist_ok=True)
            for f in run.iterdir():
                if f.is_file():
                    shutil.copy2(f, dest / f.name)


def curve(run: Path) -> dict:
    """One probe's record: status, per-step exact-answer rate and response length, and its times (a probe stopped
    before its own record: the steps it finished)."""
    from tunekit import rundir

    summary, steps = rundir.read_summary(run) or {}, rundir.read_steps(run)
    rate = [round(float(x), 4) for x in steps.get("reward/mean", [])]
    length = [round(float(x), 2) for x in steps.get("response_length/mean", [])]
    return {"status": summary.get("status", "missing"), "reason": summary.get("reason", ""), "steps": len(rate),
            "exact_first10": _mean(rate[:10]), "exact_last10": _mean(rate[-10:]), "exact_rate": rate,
            "response_length": length, "startup_s": summary.get("startup_s"), "wall_s": summary.get("wall_s"),
            "steady_step_s": summary.get("steady", {}).get("timing_s/step"), "samples": samples(run)}


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def samples(run: Path) -> dict[str, list[dict]]:
    """Two samples of the first and of the last step samples.parquet kept: what the model said."""
    from tunekit import rundir

    said = rundir.read_samples(run)
    if said.empty:
        return {}
    keep = ["prompt", "response", "answer", "reward"]
    return {f"step {int(s)}": said[said["step"] == s][keep].head(2).to_dict("records")
            for s in sorted({said["step"].min(), said["step"].max()})}


def collect(out: Path, args: argparse.Namespace) -> dict:
    probes = sorted(p for p in (out / "runs").glob("*/*") if (p / "config.yaml").is_file())
    runs = {p.parent.name: curve(p) for p in probes}  # runs/<runner>-s<seed>/<run id>
    per_runner = {}
    for runner in RUNNERS:
        mine = [c["exact_rate"] for name, c in runs.items() if name.startswith(f"{runner}-") and c["exact_rate"]]
        if mine:
            n = min(map(len, mine))
            per_runner[runner] = {"seeds": len(mine), "mean_exact_rate": [round(sum(c[i] for c in mine) / len(mine), 4)
                                                                          for i in range(n)]}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": commit or "unknown",
            "recipe": RECIPE, "metric": "reward/mean = exact-answer rate (tunekit.workload.arith_qa:reward)",
            "runs": runs, "per_runner": per_runner}


def table(result: dict) -> str:
    lines = ["| probe | status | steps | exact first 10 | exact last 10 | steady step s | start-up s |",
             "|---|---|---|---|---|---|---|"]
    for name, c in result["runs"].items():
        cells = [name, c["status"], c["steps"], c["exact_first10"], c["exact_last10"], c["steady_step_s"], c["startup_s"]]
        lines.append("| " + " | ".join("unknown" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
                                       for v in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    args, t0 = parse(), time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.prepare:
        prepare()
        return 0
    if not args.collect:
        prepare()
        procs = launch(args, out, t0)
        for name, proc in procs.items():
            left = args.budget_s - (time.monotonic() - t0) - 15
            try:
                proc.wait(timeout=max(left, 1))
            except subprocess.TimeoutExpired:  # its own probe.timeout_s should have ended it first
                proc.send_signal(signal.SIGINT)  # tunekit probe then kills its process tree
                proc.wait(timeout=20)
            print(f"{name}: exit {proc.returncode} at {time.monotonic() - t0:.0f} s", flush=True)
    if runs_dir(args, out) != out / "runs":
        keep(runs_dir(args, out), out)
    result = collect(out, args)
    (out / "smollm2_curves.json").write_text(json.dumps(result, indent=1))
    (out / "smollm2_curves.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
