"""Exhaustive grid vs Optuna search on the embedded default (CPU): does the search find the cheap config for less?

Runs every configuration of a recipe's categorical search space once (the grid),
then the search ``--repeats`` times (fresh studies, confirmation round included)
with a probe budget of ``--budget-share`` (40%) of the grid's probe spend. Each
configuration is priced as the search prices it: the full run defined by the
recipe's ``run.*`` (until the threshold, for tiny-ppo), from the probe's own
reward curve, with the reward's interval and verdict (``tunekit.search.measure``).
Passes when each search's answer costs within 5% of the grid's cheapest feasible
configuration, each spent at most 40% of the grid, and the repeats name the same
answer (or say that the top two are within noise).

The search's pick is judged twice: by its own probe's projection, and by the
grid's measurement of the same configuration (one measurement for both sides,
so CPU timing noise between two probes of one configuration does not decide it).

Every probe runs on ``--cores-per-job`` pinned cores (2: a 2-core machine). On a
many-core host, ``--jobs`` grid probes and ``--workers`` search workers (one
study, joined with --resume) run side by side, each on its own cores; spend is
counted per probe, so it does not depend on how many run at once.

    python benchmarks/search_vs_grid.py                              # one 2-core slot, tiny-ppo (5 knobs, 32 configs), 3 searches
    python benchmarks/search_vs_grid.py --jobs 15 --workers 3        # a 32-core host
    python benchmarks/search_vs_grid.py --grid-only --jobs 15        # grid only (→ WORK/grid.json)
    python benchmarks/search_vs_grid.py --grid-from WORK/grid.json   # search against an earlier grid

Probes re-import tunekit, so run it from a copy of the tree that nothing edits during the
hours it takes.

Writes search_vs_grid.json and .md into ``--results`` (default: ``--work``), rewritten after each search;
``benchmarks/collect.py search_vs_grid RESULTS/search_vs_grid.json`` files the table under benchmarks/results/.
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
from tunekit.config.errors import TunekitError  # noqa: E402

WITHIN = 0.05


def _cores(slot: int, per: int) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[slot * per:(slot + 1) * per]


def _pinned(cmd: list[str], cores: list[int], **kw) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", ",".join(map(str, cores)), *cmd], **kw)


# ---------------------------------------------------------------- grid


def one_probe(recipe_ref: str, sets: list[str], out: str) -> None:
    """Child mode: run one probe, print its outcome, priced as the search prices it, as JSON on the last line."""
    from tunekit.launch.probe import run_probe
    from tunekit.search.measure import read_probe

    recipe = load_recipe(recipe_ref, sets)
    raw = recipe.model_dump(mode="json")
    raw["probe"]["steps"] = recipe.search.probe_steps or recipe.probe.steps
    try:
        recipe = validate(raw, "grid")
        res = run_probe(recipe, out=out)
    except TunekitError as e:
        print(json.dumps({"status": "invalid", "reason": e.message, "probe_yuan": 0.0}))
        return
    s, row = res.summary, {}
    if res.status == "ok" and s.get("steps"):
        from tunekit.launch.probe import pick_profile

        rd = read_probe(recipe, res.run_dir, s, pick_profile(None, False))
        row = {"projected_yuan": rd.yuan, "projected_steps": rd.length.steps, "run_rule": rd.length.rule,
               "reward": rd.reward.value, "reward_ci": [rd.reward.low, rd.reward.high],
               "verdict": rd.verdict(recipe.search.reward_threshold)}
    print(json.dumps({"status": res.status, "reason": s.get("reason", ""), "probe_yuan": s.get("cost/probe_yuan", 0.0),
                      "wall_s": s.get("wall_s"), "run_dir": str(res.run_dir)} | row))


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


def search_summary(where: str, out: Path) -> dict:
    """A search's trials (from its study) and its answer (worker 0's search.json, written after the confirmation round)."""
    storage, name = where.split("#")
    study = optuna.load_study(study_name=name, storage=storage)
    rows = []
    for t in study.get_trials():
        ua = t.user_attrs
        rows.append({"number": t.number, "state": t.state.name, "params": t.params, "sets": ua.get("sets", []),
                     "status": ua.get("status"), "verdict": ua.get("verdict"), "feasible": ua.get("verdict") == "feasible",
                     "value": t.value, "probe_yuan": ua.get("probe_yuan", 0.0), "duplicate_of": ua.get("duplicate_of"),
                     "reward": ua.get("reward")})
    result = json.loads((out / "search.json").read_text())
    best = next((r for r in rows if result["best"] and r["number"] == result["best"]["number"]), None)
    return {"study": name, "storage": storage, "rows": rows, "best": best, "spent_yuan": result["spent_yuan"],
            "verdict": result["verdict"], "answer": result["answer"], "confirmation": result.get("confirmation")}


# ---------------------------------------------------------------- report


def _asset_digest() -> str:
    """Fingerprint of the embedded checkpoint: a grid and a search are only comparable on the same weights."""
    import hashlib

    from tunekit.workload.models import EMBEDDED_MODEL_DIR

    f = EMBEDDED_MODEL_DIR / "model.safetensors"
    return hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.exists() else "missing"


def _y(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def markdown(rep: dict) -> str:
    g, runs = rep["grid"], rep["searches"]
    run = "until the smoothed reward reaches the threshold" if rep["run"]["until"] == "threshold" else f"{rep['run']['samples']} samples"
    lines = [
        "# Search vs exhaustive grid (CPU, embedded default)", "",
        f"Recipe `{rep['recipe']}` ({rep['knobs']} knobs, {g['configurations']} configurations), {rep['probe_steps']}-step probes, "
        f"threshold {rep['reward_threshold']} (mean reward of the last {rep['reward_window']} steps, 95% bootstrap interval), "
        f"full run: {run}; profile `cpu`. Each probe on {rep['cores_per_job']} pinned cores. Host: {rep['host']}.", "",
        f"Command: `{rep['command']}`", "",
        f"Grid: {g['probes']} probes, {g['spent_yuan']:.4g} yuan, {g['wall_s']:.0f} s; {g['feasible']} feasible; cheapest feasible "
        f"{_y(g['best_projected_yuan'])} yuan: `{' '.join(g['best_sets'] or [])}`", "",
        "| search | probes | spend (share of grid) | verdict | answer | projected yuan (own / grid's) | within 5% | spend <= share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, s in enumerate(runs):
        lines.append(f"| {k + 1} | {s['probes']} ({s['trials']} trials) | {s['spent_yuan']:.4g} ({100 * s['spent_yuan'] / g['spent_yuan']:.1f}%) "
                     f"| {s['verdict']} | `{' '.join(s['best_sets'] or [])}` | {_y(s['best_projected_yuan'])} / {_y(s['best_on_grid_yuan'])} "
                     f"| {s['pass_within']} | {s['pass_spend']} |")
    lines += ["", f"Repeated searches agree (same answer, or each says within noise): **{rep['repeats_agree']}**", ""]
    lines += [f"- search {k + 1}: {s['answer']}" for k, s in enumerate(runs)]
    lines += ["", "Grid (every configuration):", "",
              "| configuration | status | verdict | reward [95%] | run steps | projected yuan | probe yuan |", "|---|---|---|---|---|---|---|"]
    for r in g["rows"]:
        ci = r.get("reward_ci")
        rw = f"{_y(r.get('reward'))} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else _y(r.get("reward"))
        lines.append(f"| {' '.join(r['sets'])} | {r['status']} | {r.get('verdict') or '-'} | {rw} | {r.get('projected_steps') or '-'} "
                     f"| {_y(r.get('projected_yuan'))} | {_y(r.get('probe_yuan'))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny-ppo")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="recipe override for grid and search (repeatable)")
    ap.add_argument("--budget-share", type=float, default=0.40)
    ap.add_argument("--trials", type=int, default=32, help="cap on search trials (the budget usually stops it first)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed (worker w of search k uses seed + 100 k + w)")
    ap.add_argument("--repeats", type=int, default=3, help="searches in a row, each a fresh study against the same grid")
    ap.add_argument("--jobs", type=int, default=1, help="grid probes side by side")
    ap.add_argument("--workers", type=int, default=1, help="search workers side by side (one study)")
    ap.add_argument("--cores-per-job", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunekit-search-vs-grid"))
    ap.add_argument("--results", type=Path, help="where search_vs_grid.json/.md go (default: --work)")
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
    args.results = args.results or args.work
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
    grid_spent = sum(r.get("probe_yuan") or 0.0 for r in grid["rows"])
    feasible = [r for r in grid["rows"] if r.get("verdict") == "feasible" and r.get("projected_yuan") is not None]
    gbest = min(feasible, key=lambda r: r["projected_yuan"]) if feasible else None
    gb = gbest["projected_yuan"] if gbest else None
    by_key = {json.dumps(r["params"], sort_keys=True): r for r in grid["rows"]}

    if grid.get("asset", digest) != digest or _asset_digest() != digest:
        sys.exit("the embedded checkpoint changed during the grid; rerun the benchmark (the grid and search must share weights)")
    searches = []
    for k in range(args.repeats):
        work = args.work / f"search{k}"
        where, wall = run_workers(args.recipe, args.sets, args.budget_share * grid_spent, args.trials, work, args.workers,
                                  args.cores_per_job, args.seed + 100 * k)
        s = search_summary(where, work / "search" / "w0")
        pick = by_key.get(json.dumps(s["best"]["params"], sort_keys=True)) if s["best"] else None
        on_grid = pick["projected_yuan"] if pick and pick.get("verdict") == "feasible" else None
        probed = [r for r in s["rows"] if r["duplicate_of"] is None and r["status"] not in (None, "invalid")]
        searches.append({
            "probes": len(probed), "trials": len(s["rows"]), "workers": args.workers, "spent_yuan": s["spent_yuan"],
            "budget_yuan": args.budget_share * grid_spent, "wall_s": wall, "feasible": sum(r["feasible"] for r in probed),
            "best_projected_yuan": s["best"]["value"] if s["best"] else None, "best_sets": s["best"]["sets"] if s["best"] else None,
            "best_on_grid_yuan": on_grid, "verdict": s["verdict"], "answer": s["answer"], "study": s["study"],
            "pass_within": bool(gb and on_grid is not None and on_grid <= (1 + WITHIN) * gb),
            "pass_within_own": bool(gb and s["best"] and s["best"]["value"] <= (1 + WITHIN) * gb),
            "pass_spend": bool(grid_spent and s["spent_yuan"] <= args.budget_share * grid_spent),
            "trials_rows": s["rows"], "confirmation": s["confirmation"]})
        _write_report(args, recipe, grid, gbest, feasible, grid_spent, searches, digest)


def _write_report(args: argparse.Namespace, recipe, grid: dict, gbest: dict | None, feasible: list, grid_spent: float,
                  searches: list[dict], digest: str) -> None:
    """search_vs_grid.json and .md with the searches so far (rewritten after each, so a stopped run keeps them)."""
    gb = gbest["projected_yuan"] if gbest else None
    answers = {json.dumps(x["best_sets"]) for x in searches}
    rep = {
        "recipe": recipe.name, "knobs": len(recipe.search.space), "probe_steps": recipe.search.probe_steps or recipe.probe.steps,
        "reward_threshold": recipe.search.reward_threshold, "reward_window": recipe.search.reward_window,
        "run": recipe.run.model_dump(), "budget_share": args.budget_share, "cores_per_job": args.cores_per_job,
        "host": f"{platform.node()}, {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores",
        "command": "python benchmarks/search_vs_grid.py " + " ".join(sys.argv[1:]),
        "grid": {"configurations": len(grid["rows"]), "probes": sum(r["status"] != "invalid" for r in grid["rows"]),
                 "spent_yuan": grid_spent, "wall_s": grid["wall_s"], "jobs": grid["jobs"], "feasible": len(feasible),
                 "best_projected_yuan": gb, "best_sets": gbest["sets"] if gbest else None, "rows": grid["rows"]},
        "searches": searches,
        "repeats_agree": len(answers) == 1 or all(x["verdict"] == "within noise" for x in searches),
        "asset_sha256_16": digest, "asset_unchanged": _asset_digest() == digest,
        "code": (ROOT / "FROZEN_FROM").read_text().strip() if (ROOT / "FROZEN_FROM").exists() else "working tree",
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "search_vs_grid.json").write_text(json.dumps(rep, indent=2, default=str))
    (args.results / "search_vs_grid.md").write_text(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
