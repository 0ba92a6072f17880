"""Exhaustive grid vs Optuna search on the embedded default (CPU): does the search find the cheap config for less?

Runs every configuration of a recipe's categorical search space once (the grid),
then ``run_search`` once with a probe budget of ``--budget-share`` (40%) of the
grid's probe spend. Passes when the search's best configuration costs within 5%
of the grid's cheapest feasible one and the search spent at most 40% of the grid.

The search's pick is judged twice: by its own probe's projection, and by the
grid's measurement of the same configuration (same measurement for both sides,
so CPU timing noise between two probes of one configuration does not decide it).

    python benchmarks/search_vs_grid.py                      # tiny-ppo: 5 knobs, 32 configurations
    python benchmarks/search_vs_grid.py --probe-steps 20 --work /tmp/svg

Writes benchmarks/search_vs_grid.json and .md (next to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from tunekit import space  # noqa: E402
from tunekit.config import apply_overrides, load_recipe, validate  # noqa: E402
from tunekit.errors import TunekitError  # noqa: E402
from tunekit.probe import run_probe  # noqa: E402
from tunekit.records import read_steps  # noqa: E402
from tunekit.search import run_search  # noqa: E402

WITHIN = 0.05


def key_of(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def run_grid(recipe, raw: dict, runs: Path) -> list[dict]:
    rows = []
    combos = space.grid(recipe.search.space, raw)
    for i, params in enumerate(combos):
        row = {"params": params, "sets": space.overrides(params)}
        try:
            r = validate(apply_overrides(raw, row["sets"]), "grid")
            res = run_probe(r, out=runs)
        except TunekitError as e:
            rows.append(row | {"status": "invalid", "reason": e.message, "probe_yuan": 0.0, "projected_yuan": None, "reward": None,
                               "feasible": False})
            print(f"grid {i + 1}/{len(combos)} invalid: {e.message}", flush=True)
            continue
        s = res.summary
        reward = None
        if res.status == "ok":
            rewards = read_steps(res.run_dir)["reward/mean"].tolist()[-recipe.search.reward_window:]
            reward = sum(rewards) / len(rewards)
        feasible = res.status == "ok" and reward >= recipe.search.reward_threshold
        rows.append(row | {"status": res.status, "reason": s.get("reason", ""), "probe_yuan": s.get("cost/probe_yuan", 0.0),
                           "projected_yuan": s.get("cost/projected_yuan"), "reward": reward, "feasible": feasible,
                           "wall_s": s.get("wall_s"), "run_dir": str(res.run_dir)})
        print(f"grid {i + 1}/{len(combos)} {res.status} reward={reward} projected={s.get('cost/projected_yuan')} "
              f"wall={s.get('wall_s'):.1f}s", flush=True)
    return rows


def markdown(rep: dict) -> str:
    g, s = rep["grid"], rep["search"]
    lines = [
        "# Search vs exhaustive grid (CPU, embedded default)", "",
        f"Recipe `{rep['recipe']}`, {rep['knobs']} knobs, {g['configurations']} configurations, "
        f"{rep['probe_steps']}-step probes, threshold {rep['reward_threshold']} (mean reward of the last {rep['reward_window']} steps), "
        f"profile `{rep['profile']}`. Host: {rep['host']}.", "",
        f"Command: `{rep['command']}`", "",
        "| | grid | search |", "|---|---|---|",
        f"| probes run | {g['probes']} | {s['probes']} |",
        f"| probe spend (yuan) | {g['spent_yuan']:.4g} | {s['spent_yuan']:.4g} ({100 * s['spent_yuan'] / g['spent_yuan']:.1f}% of grid) |",
        f"| wall time (s) | {g['wall_s']:.0f} | {s['wall_s']:.0f} |",
        f"| feasible configurations found | {g['feasible']} | {s['feasible']} |",
        f"| cheapest feasible, projected yuan | {_y(g['best_projected_yuan'])} | {_y(s['best_projected_yuan'])} (own probe) |",
        f"| search's pick as measured by the grid | | {_y(s['best_on_grid_yuan'])} |", "",
        f"- grid's cheapest feasible: `{' '.join(g['best_sets'] or [])}`",
        f"- search's best: `{' '.join(s['best_sets'] or [])}`",
        f"- within {100 * WITHIN:.0f}% of the grid's cheapest (grid measurement of the pick): **{rep['pass_within']}**",
        f"- within {100 * WITHIN:.0f}% (search's own measurement): **{rep['pass_within_own']}**",
        f"- search spend <= {100 * rep['budget_share']:.0f}% of the grid's: **{rep['pass_spend']}**",
        f"- search stop: {s['stop_reason']}", "",
        "Grid (every configuration):", "", "| params | status | reward | projected yuan | probe yuan |", "|---|---|---|---|---|",
    ]
    for r in rep["grid_rows"]:
        lines.append(f"| {' '.join(r['sets'])} | {r['status']} | {_y(r['reward'])} | {_y(r['projected_yuan'])} | {_y(r['probe_yuan'])} |")
    return "\n".join(lines) + "\n"


def _y(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny-ppo")
    ap.add_argument("--probe-steps", type=int, default=None, help="default: the recipe's search.probe_steps")
    ap.add_argument("--budget-share", type=float, default=0.40)
    ap.add_argument("--trials", type=int, default=32, help="cap on search trials (the budget usually stops it first)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunekit-search-vs-grid"))
    args = ap.parse_args()

    sets = [f"search.probe_steps={args.probe_steps}"] if args.probe_steps else []
    recipe = load_recipe(args.recipe, sets)
    raw = recipe.model_dump(mode="json")
    raw["probe"]["steps"] = recipe.search.probe_steps or recipe.probe.steps
    t0 = time.monotonic()
    grid = run_grid(recipe, raw, args.work / "grid" / "runs")
    grid_wall = time.monotonic() - t0
    grid_spent = sum(r["probe_yuan"] for r in grid)
    feasible = [r for r in grid if r["feasible"]]
    gbest = min(feasible, key=lambda r: r["projected_yuan"]) if feasible else None

    t0 = time.monotonic()
    res = run_search(recipe, budget_yuan=args.budget_share * grid_spent, trials=args.trials, out_dir=args.work / "search",
                     seed=args.seed, study_name=f"{recipe.name}-vs-grid-{int(time.time())}", recipe_ref=args.recipe, base_overrides=sets)
    search_wall = time.monotonic() - t0
    by_key = {key_of(r["params"]): r for r in grid}
    pick = by_key.get(key_of(res.best["params"])) if res.best else None
    on_grid = pick["projected_yuan"] if pick and pick["feasible"] else None
    gb = gbest["projected_yuan"] if gbest else None
    rep = {
        "recipe": recipe.name, "knobs": len(recipe.search.space), "probe_steps": raw["probe"]["steps"],
        "reward_threshold": recipe.search.reward_threshold, "reward_window": recipe.search.reward_window, "profile": res.profile,
        "budget_share": args.budget_share, "seed": args.seed, "host": f"{platform.node()} {os.cpu_count()} CPU(s), load avg at end {os.getloadavg()}",
        "command": "python benchmarks/search_vs_grid.py " + " ".join(sys.argv[1:]),
        "grid": {"configurations": len(grid), "probes": sum(r["status"] != "invalid" for r in grid), "spent_yuan": grid_spent,
                 "wall_s": grid_wall, "feasible": len(feasible), "best_projected_yuan": gb, "best_sets": gbest["sets"] if gbest else None},
        "search": {"probes": sum(1 for r in res.trials if r["duplicate_of"] is None and r["status"] not in ("invalid",)),
                   "trials": len(res.trials), "spent_yuan": res.spent_yuan, "budget_yuan": res.budget_yuan, "wall_s": search_wall,
                   "feasible": sum(r["feasible"] for r in res.trials if r["duplicate_of"] is None),
                   "best_projected_yuan": res.best["projected_yuan"] if res.best else None,
                   "best_sets": res.best["sets"] if res.best else None, "best_on_grid_yuan": on_grid, "stop_reason": res.stop_reason,
                   "search_json": str(res.json_path)},
        "pass_within": bool(gb and on_grid is not None and on_grid <= (1 + WITHIN) * gb),
        "pass_within_own": bool(gb and res.best and res.best["projected_yuan"] <= (1 + WITHIN) * gb),
        "pass_spend": bool(grid_spent and res.spent_yuan <= args.budget_share * grid_spent),
        "grid_rows": grid,
    }
    (HERE / "search_vs_grid.json").write_text(json.dumps(rep, indent=2, default=str))
    (HERE / "search_vs_grid.md").write_text(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
