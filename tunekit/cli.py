"""The ``tunekit`` command: each command declares options and hands off to one library function."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tunekit.errors import TunekitError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Find the cheapest RL post-training configuration that still learns.")
out = Console()
err = Console(stderr=True)

RecipeOpt = Annotated[Optional[str], typer.Option("--recipe", "-r", help="Recipe name in recipes/ or a YAML path; default: the embedded default.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a recipe key: dotted.key=value (repeatable).")]


def _fail(e: TunekitError) -> None:
    err.print(f"[red]error:[/red] {e.message}", highlight=False)
    raise typer.Exit(e.exit_code)


@app.command()
def probe(
    recipe: RecipeOpt = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default: the recipe's probe.steps).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Runs directory (default runs/).")] = None,
    gpu_profile: Annotated[Optional[str], typer.Option(help="Price profile name or YAML path; default: from the GPU NVML reports.")] = None,
    set_: SetOpt = None,
) -> None:
    """Run one short training probe and record its cost and reward."""
    from tunekit.config import load_recipe
    from tunekit.probe import run_probe

    overrides = list(set_ or [])
    overrides += [f"probe.steps={steps}"] if steps is not None else []
    overrides += [f"probe.seed={seed}"] if seed is not None else []
    try:
        r = load_recipe(recipe, overrides)
        with Progress(TextColumn("[bold]probe[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=False) as bar:
            task = bar.add_task(r.name, total=r.probe.steps)
            result = run_probe(r, out=out_dir, gpu_profile=gpu_profile, progress=lambda n: bar.update(task, completed=n))
    except TunekitError as e:
        _fail(e)
    _print_summary(result.summary, result.run_dir)
    if result.status != "ok":
        raise typer.Exit(1)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _print_summary(s: dict, run_dir: Path) -> None:
    t = Table(title=f"probe {run_dir.name}", show_header=False)
    keys = ["status", "reason", "steps", "wall_s", "startup_s", "reward_first10", "reward_last10", "profile",
            "cost/probe_yuan", "cost/projected_yuan", "cost/target_steps"]
    steady = s.get("steady", {})
    for k in keys:
        if s.get(k) not in (None, ""):
            t.add_row(k, _fmt(s[k]))
    for k in sorted(steady):
        if k.startswith("timing_s/") or k in ("perf/throughput", "perf/max_memory_reserved_gb"):
            t.add_row(f"median {k}", _fmt(steady[k]))
    t.add_row("run dir", str(run_dir))
    out.print(t)


@app.command()
def recipes(keys: Annotated[bool, typer.Option("--keys", help="List every recipe key instead.")] = False) -> None:
    """List the recipes that ship (or every key a recipe or --set may use)."""
    from tunekit.config import RECIPES_DIR, list_keys, load_recipe

    if keys:
        for k in list_keys():
            out.print(k, highlight=False)
        return
    t = Table("name", "algorithm", "model", "backend", "controller", "description")
    try:
        for p in sorted(RECIPES_DIR.glob("*.yaml")):
            r = load_recipe(str(p))
            t.add_row(p.stem, r.algorithm.name, r.model.preset or r.model.path or "embedded tiny", r.system.rollout.backend,
                      r.system.controller, r.description)
    except TunekitError as e:
        _fail(e)
    out.print(t)


@app.command()
def profiles() -> None:
    """List the hardware price profiles that ship."""
    from tunekit.profiles import list_profiles

    t = Table("name", "GPU pattern", "memory GiB", "peak bf16 TFLOP/s", "yuan/GPU-h", "price source")
    for p in list_profiles():
        t.add_row(p.name, p.nvml_pattern or "-", _fmt(p.memory_gib), _fmt(p.peak_bf16_tflops) if p.peak_bf16_tflops else "unknown",
                  _fmt(p.yuan_per_gpu_hour), p.price_source)
    out.print(t)


def main() -> None:
    try:
        app()
    except TunekitError as e:  # a library error raised outside a command's own handler
        err.print(f"[red]error:[/red] {e.message}", highlight=False)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
