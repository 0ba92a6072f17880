"""Exhaustive grid vs Optuna search on the embedded default (CPU): does the search find the cheap config for less?

Runs every configuration of a recipe's categorical search space once (the grid),
then the search once with a probe budget of ``--budget-share`` (40%) of the
grid's probe spend. Passes when the search's best configuration costs within 5%
of the grid's cheapest feasible one and the search spent at most 40% of the grid.

The search's pick is judged twice: by its own probe's projection, and by the
grid's measurement of the same configuration (one measurement for both sides,
so CPU timing noise between two probes of one configuration does not decide it).

Every probe runs on ``--cores-per-job`` pinned cores (2: a 2-core machine). On a
many-core host, ``--jobs`` grid probes and ``--workers`` search workers (one
study, joined with --resume) run side by side, each on its own cores; spend is
counted per probe, so it does not depend on how many run at once.

    python benchmarks/search_vs_grid.py                              # one 2-core slot, tiny-ppo (5 knobs, 32 configs)
    python benchmarks/search_vs_grid.py --jobs 15 --workers 3        # a 32-core host
    python benchmarks/search_vs_grid.py --grid-only --jobs 15        # grid only (→ WORK/grid.json)
    python benchmarks/search_vs_grid.py --grid-from WORK/grid.json   # search against an earlier grid

Probes re-import tunekit, so run it from a copy of the tree that nothing edits during the
hours it takes (``--results`` puts the tables back into the checkout).

Writes benchmarks/search_vs_grid.json and .md (next to this file).
"""

from __future__ import annotations

import os

# A probe sizes its thread pool from os.cpu_count(); on pinned cores that must be the cores it may use.
os.cpu_count = lambda: len(os.sched_getaffinity(0))  # noqa: E731

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import optuna  # noqa: E402

from tunekit.search import space  # noqa: E402
from tunekit.config import load_recipe, validate  # noqa: E402
from tunekit.errors import TunekitError  # noqa: E402

WITHIN = 0.05


def _cores(slot: int, per: int) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[slot * per:(slot + 1) * per]


def _pinned(cmd: list[str], cores: list[int], **kw) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", ",".join(map(str, cores)), *cmd], **kw)


# ---------------------------------------------------------------- grid


def one_probe(recipe_ref: str, sets: list[str], out: str) -> None:
    """Child mode: run one probe, print its outcome as JSON on the last line."""
    from tunekit.launch.probe import run_probe
    from tunekit.records import read_steps

    recipe = load_recipe(recipe_ref, sets)
    raw = recipe.model_dump(mode="json")
    raw["probe"]["steps"] = recipe.search.probe_steps or recipe.probe.steps
    try:
        res = run_probe(validate(raw, "grid"), out=out)
    except TunekitError as e:
        print(json.dumps({"status": "invalid", "reason": e.message, "probe_yuan": 0.0}))
        return
    s, rewards = res.summary, []
    if res.status == "ok":
        rewards = read_steps(res.run_dir)["reward/mean"].tolist()[-recipe.search.reward_window:]
    print(json.dumps({"status": res.status, "reason": s.get("reason", ""), "probe_yuan": s.get("cost/probe_yuan", 0.0),
                      "projected_yuan": s.get("cost/projected_yuan"), "reward": sum(rewards) / len(rewards) if rewards else None,
                      "wall_s": s.get("wall_s"), "run_dir": str(res.run_dir)}))


def run_grid(ref: str, sets: list[str], work: Path, jobs: int, per: int) -> dict:
    recipe = load_recipe(ref, sets)
    raw = recipe.model_dump(mode="json")
    combos = space.grid(recipe.search.space, raw)
    t0 = time.monotonic()

    def run(i: int, params: dict) -> dict:
        psets = space.overrides(params)
        slot = i % jobs
        cmd = [sys.executable, __file__, "--_probe", json.dumps(sets + psets), "--recipe", ref, "--work", str(work / "grid" / "runs")]
        p = _pinned(cmd, _cores(slot, per), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = (p.communicate()[0].strip().splitlines() or ["{}"])[-1]
        row = {"params": params, "sets": psets} | json.loads(line)
        print(f"grid {i + 1}/{len(combos)} {row.get('status')} reward={row.get('reward')} projected={row.get('projected_yuan')}", flush=True)
        return row

    # one thread per slot, each taking the configurations of its slot in turn
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        slots = [pool.submit(lambda k=k: [run(i, c) for i, c in enumerate(combos) if i % jobs == k]) for k in range(jobs)]
        rows = [r for f in slots for r in f.result()]
    rows.sort(key=lambda r: combos.index(r["params"]))
    return {"recipe": recipe.name, "sets": sets, "rows": rows, "wall_s": time.monotonic() - t0, "jobs": jobs, "cores_per_job": per}


# ---------------------------------------------------------------- search


def run_workers(ref: str, sets: list[str], budget: float, trials: int, work: Path, workers: int, per: int, seed: int) -> tuple[str, float]:
    """The search: worker 0 creates the study, the others join it with --resume, each on its own cores."""
    name = f"vs-grid-{int(time.time())}"
    storage = f"sqlite:///{(work / 'search' / 'study.db').resolve()}"
    (work / "search").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs = []
    for w in range(workers):
        cmd = [sys.executable, __file__, "--_worker", json.dumps(sets), "--recipe", ref, "--work", str(work / "search" / f"w{w}"),
               "--budget", str(budget), "--trials", str(trials), "--seed", str(seed + w), "--study", name, "--storage", storage]
        cmd += ["--resume"] if w else []
        log = (work / "search" / f"w{w}.log").open("w")
        procs.append(_pinned(cmd, _cores(w, per), stdout=log, stderr=subprocess.STDOUT))
        if w == 0:  # the others join once the study exists
            while not _has_study(storage, name) and procs[0].poll() is None:
                time.sleep(1)
    for p in procs:
        p.wait()
    return storage + "#" + name, time.monotonic() - t0


def _has_study(storage: str, name: str) -> bool:
    if not Path(storage.removeprefix("sqlite:///")).exists():
        return False
    try:
        return name in optuna.study.get_all_study_names(storage)
    except Exception:  # noqa: BLE001 - the file may be half-created
        return False


def worker(ref: str, sets: list[str], args: argparse.Namespace) -> None:
    from tunekit.search import run_search

    recipe = load_recipe(ref, sets)
    try:
        r = run_search(recipe, budget_yuan=args.budget, trials=args.trials, storage=args.storage, resume=args.resume,
                       out_dir=args.work, study_name=args.study, seed=args.seed, recipe_ref=ref, base_overrides=sets,
                       progress_cb=lambda e: print(e, flush=True) if e["event"] in ("trial", "stop") else None)
        print(r.stop_reason, flush=True)
    except TunekitError as e:  # e.g. the budget was used up by the other workers before this one started
        print(f"worker stopped: {e.message}", flush=True)


def search_summary(where: str) -> dict:
    storage, name = where.split("#")
    study = optuna.load_study(study_name=name, storage=storage)
    rows = []
    for t in study.get_trials():
        ua = t.user_attrs
        feasible = t.state.name == "COMPLETE" and bool(t.constraints) and all(v <= 0 for v in t.constraints.values())
        rows.append({"number": t.number, "state": t.state.name, "params": t.params, "sets": ua.get("sets", []),
                     "status": ua.get("status"), "feasible": feasible, "value": t.value, "probe_yuan": ua.get("probe_yuan", 0.0),
                     "duplicate_of": ua.get("duplicate_of"), "reward": ua.get("reward")})
    best = min((r for r in rows if r["feasible"]), key=lambda r: r["value"], default=None)
    return {"study": name, "storage": storage, "rows": rows, "best": best, "spent_yuan": sum(r["probe_yuan"] for r in rows)}


# ---------------------------------------------------------------- report


def _asset_digest() -> str:
    """Fingerprint of the embedded checkpoint: a grid and a search are only comparable on the same weights."""
    import hashlib

    from tunekit.models import EMBEDDED_MODEL_DIR

    f = EMBEDDED_MODEL_DIR / "model.safetensors"
    return hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.exists() else "missing"


def _y(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def markdown(rep: dict) -> str:
    g, s = rep["grid"], rep["search"]
    lines = [
        "# Search vs exhaustive grid (CPU, embedded default)", "",
        f"Recipe `{rep['recipe']}` ({rep['knobs']} knobs, {g['configurations']} configurations), {rep['probe_steps']}-step probes, "
        f"threshold {rep['reward_threshold']} (mean reward of the last {rep['reward_window']} steps), profile `cpu`. "
        f"Each probe on {rep['cores_per_job']} pinned cores. Host: {rep['host']}.", "",
        f"Command: `{rep['command']}`", "",
        "| | grid | search |", "|---|---|---|",
        f"| probes run | {g['probes']} | {s['probes']} ({s['trials']} trials, {s['workers']} worker(s)) |",
        f"| probe spend (yuan) | {g['spent_yuan']:.4g} | {s['spent_yuan']:.4g} ({100 * s['spent_yuan'] / g['spent_yuan']:.1f}% of the grid's) |",
        f"| wall time (s) | {g['wall_s']:.0f} ({g['jobs']} slot(s) side by side) | {s['wall_s']:.0f} |",
        f"| feasible configurations | {g['feasible']} | {s['feasible']} |",
        f"| cheapest feasible, projected yuan | {_y(g['best_projected_yuan'])} | {_y(s['best_projected_yuan'])} (its own probe) |",
        f"| search's pick as the grid measured it | | {_y(s['best_on_grid_yuan'])} |", "",
        f"- grid's cheapest feasible: `{' '.join(g['best_sets'] or [])}`",
        f"- search's best: `{' '.join(s['best_sets'] or [])}`",
        f"- within {100 * WITHIN:.0f}% of the grid's cheapest (grid's measurement of the pick): **{rep['pass_within']}**",
        f"- within {100 * WITHIN:.0f}% (the search's own measurement): **{rep['pass_within_own']}**",
        f"- search spend <= {100 * rep['budget_share']:.0f}% of the grid's: **{rep['pass_spend']}**", "",
        "Grid (every configuration):", "", "| configuration | status | reward | projected yuan | probe yuan |", "|---|---|---|---|---|",
    ]
    for r in g["rows"]:
        lines.append(f"| {' '.join(r['sets'])} | {r['status']} | {_y(r.get('reward'))} | {_y(r.get('projected_yuan'))} | "
                     f"{_y(r.get('probe_yuan'))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny-ppo")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="recipe override for grid and search (repeatable)")
    ap.add_argument("--budget-share", type=float, default=0.40)
    ap.add_argument("--trials", type=int, default=32, help="cap on search trials (the budget usually stops it first)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed (worker w uses seed + w)")
    ap.add_argument("--jobs", type=int, default=1, help="grid probes side by side")
    ap.add_argument("--workers", type=int, default=1, help="search workers side by side (one study)")
    ap.add_argument("--cores-per-job", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunekit-search-vs-grid"))
    ap.add_argument("--results", type=Path, default=HERE, help="where search_vs_grid.json/.md go (default: next to this script)")
    ap.add_argument("--grid-only", action="store_true")
    ap.add_argument("--grid-from", type=Path)
    # internal child modes
    ap.add_argument("--_probe", help=argparse.SUPPRESS)
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--study", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._probe:
        return one_probe(args.recipe, json.loads(args._probe), str(args.work))
    if args._worker:
        return worker(args.recipe, json.loads(args._worker), args)

    args.work.mkdir(parents=True, exist_ok=True)
    digest = _asset_digest()
    if args.grid_from:
        grid = json.loads(args.grid_from.read_text())
    else:
        grid = run_grid(args.recipe, args.sets, args.work, args.jobs, args.cores_per_job) | {"asset": digest}
        (args.work / "grid.json").write_text(json.dumps(grid, indent=2))
    if args.grid_only:
        print(f"grid written to {args.work / 'grid.json'}")
        return
    recipe = load_recipe(args.recipe, args.sets)
    th = recipe.search.reward_threshold
    for r in grid["rows"]:  # feasibility under this run's threshold (a grid may come from an earlier run)
        r["feasible"] = r["status"] == "ok" and r.get("reward") is not None and r["reward"] >= th
    grid_spent = sum(r.get("probe_yuan") or 0.0 for r in grid["rows"])
    feasible = [r for r in grid["rows"] if r["feasible"]]
    gbest = min(feasible, key=lambda r: r["projected_yuan"]) if feasible else None

    if grid.get("asset", digest) != digest or _asset_digest() != digest:
        sys.exit("the embedded checkpoint changed during the grid; rerun the benchmark (the grid and search must share weights)")
    where, wall = run_workers(args.recipe, args.sets, args.budget_share * grid_spent, args.trials, args.work, args.workers,
                              args.cores_per_job, args.seed)
    s = search_summary(where)
    by_key = {json.dumps(r["params"], sort_keys=True): r for r in grid["rows"]}
    pick = by_key.get(json.dumps(s["best"]["params"], sort_keys=True)) if s["best"] else None
    on_grid = pick["projected_yuan"] if pick and pick["feasible"] else None
    gb = gbest["projected_yuan"] if gbest else None
    probed = [r for r in s["rows"] if r["duplicate_of"] is None and r["status"] not in (None, "invalid")]
    rep = {
        "recipe": recipe.name, "knobs": len(recipe.search.space), "probe_steps": recipe.search.probe_steps or recipe.probe.steps,
        "reward_threshold": th, "reward_window": recipe.search.reward_window, "budget_share": args.budget_share,
        "cores_per_job": args.cores_per_job,
        "host": f"{platform.node()}, {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores",
        "command": "python benchmarks/search_vs_grid.py " + " ".join(sys.argv[1:]),
        "grid": {"configurations": len(grid["rows"]), "probes": sum(r["status"] != "invalid" for r in grid["rows"]),
                 "spent_yuan": grid_spent, "wall_s": grid["wall_s"], "jobs": grid["jobs"], "feasible": len(feasible),
                 "best_projected_yuan": gb, "best_sets": gbest["sets"] if gbest else None, "rows": grid["rows"]},
        "search": {"probes": len(probed), "trials": len(s["rows"]), "workers": args.workers, "spent_yuan": s["spent_yuan"],
                   "budget_yuan": args.budget_share * grid_spent, "wall_s": wall, "feasible": sum(r["feasible"] for r in probed),
                   "best_projected_yuan": s["best"]["value"] if s["best"] else None, "best_sets": s["best"]["sets"] if s["best"] else None,
                   "best_on_grid_yuan": on_grid, "study": s["study"], "trials_rows": s["rows"]},
        "pass_within": bool(gb and on_grid is not None and on_grid <= (1 + WITHIN) * gb),
        "pass_within_own": bool(gb and s["best"] and s["best"]["value"] <= (1 + WITHIN) * gb),
        "pass_spend": bool(grid_spent and s["spent_yuan"] <= args.budget_share * grid_spent),
        "asset_sha256_16": digest, "asset_unchanged": _asset_digest() == digest,
        "code": (ROOT / "FROZEN_FROM").read_text().strip() if (ROOT / "FROZEN_FROM").exists() else "working tree",
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "search_vs_grid.json").write_text(json.dumps(rep, indent=2, default=str))
    (args.results / "search_vs_grid.md").write_text(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
