"""Project a recipe's full-run cost from earlier probes of it, without running anything.

A run matches when its ``config.yaml`` resolves to the recipe's configuration in
every key that changes what a training step runs (``tunekit.config.what_runs``: the
learning and systems keys); keys that only change the probe (``probe.*``,
``profiler.*``, ``search.*``, the name) are set aside.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from tunekit import cost
from tunekit.config import Recipe, what_runs
from tunekit.errors import ConfigError, TunekitError
from tunekit.profiles import PriceProfile, load_profile
from tunekit.rundir import find_configs, read_config, read_steps, read_summary


@dataclass
class RunProjection:
    run_dir: Path
    profile: str
    steps: int
    """Steps the probe ran."""
    run_steps: int
    """Steps of the full run it was projected to."""
    mean_step_s: float
    startup_s: float
    gpus_held: int
    wall_s: float
    gpu_hours: float
    yuan: float
    measured_on: str
    """The profile of the probe's own hardware (differs from ``profile`` when repriced)."""


@dataclass
class Estimate:
    recipe: str
    run_rule: str
    """How the full run's length was decided (``run.*``, or the ``--target-steps`` given)."""
    runs: list[RunProjection]
    skipped: int
    """Matching runs that did not end ok (no steady step times to project from), or never reached the threshold
    of a run that lasts until it."""

    @property
    def yuan(self) -> float:
        return statistics.median(r.yuan for r in self.runs)

    @property
    def wall_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def gpu_hours(self) -> float:
        return statistics.median(r.gpu_hours for r in self.runs)


def matching_runs(recipe: Recipe, runs_dir: Path) -> list[tuple[Path, Recipe]]:
    want = what_runs(recipe)
    found = []
    for cfg in find_configs(Path(runs_dir)):
        try:
            run = read_config(cfg.parent)
        except (TunekitError, yaml.YAMLError):
            continue  # written by another version of tunekit, or not a run dir
        if what_runs(run) == want:
            found.append((cfg.parent, run))
    return found


def _profile(name: str | None, summary: dict) -> PriceProfile | None:
    chosen = name or summary.get("profile")
    return load_profile(chosen) if chosen and chosen != "unknown" else None


def estimate(recipe: Recipe, *, runs_dir: str | Path = "runs", gpu_profile: str | None = None,
             target_steps: int | None = None) -> Estimate:
    """Median projection over the ok probes of this recipe under ``runs_dir``; ConfigError when there are none.

    The full run is the recipe's ``run.*`` (its samples, or until the threshold on each probe's own reward
    curve), or ``target_steps`` steps when given.

    ``gpu_profile`` reprices the measured step times; it does not convert them to other hardware.
    """
    if not Path(runs_dir).is_dir():
        raise ConfigError(f"--runs {runs_dir}: no such directory; point it at the runs directory of earlier probes.")
    projections, skipped, rule = [], 0, f"{target_steps} steps (given)"
    for run_dir, run in matching_runs(recipe, Path(runs_dir)):
        summary = read_summary(run_dir) or {}
        steps = read_steps(run_dir)
        profile = _profile(gpu_profile, summary)
        if summary.get("status") != "ok" or "timing_s/step" not in steps or profile is None:
            skipped += 1
            continue
        length = cost.run_length(until=recipe.run.until, samples=recipe.run.samples, rewards=steps["reward/mean"].tolist(),
                                 samples_per_step=recipe.system.batch.samples_per_step,
                                 threshold=recipe.search.reward_threshold, window=recipe.search.reward_window)
        target = target_steps or length.steps
        if target is None:  # until the threshold, which this probe never reached
            skipped += 1
            continue
        rule = rule if target_steps else length.rule
        held = run.system.world_size
        p = cost.project_probe(steps, wall_s=float(summary.get("wall_s", 0.0)),
                               startup_s=float(summary.get("startup_s", 0.0)), warmup_steps=run.probe.warmup_steps,
                               target_steps=target, gpus_held=held, profile=profile)
        projections.append(RunProjection(run_dir, profile.name, len(steps), target, p.mean_step_s, float(summary.get("startup_s", 0.0)),
                                         held, p.wall_s, p.gpu_hours, p.yuan, str(summary.get("profile", "unknown"))))
    if not projections:
        extra = f" ({skipped} matching run(s) did not end ok)" if skipped else ""
        raise ConfigError(f"no finished probe of recipe {recipe.name!r} under {runs_dir}{extra}; run "
                          f"`tunekit probe --recipe {recipe.name}` first or point --runs at its runs directory.")
    return Estimate(recipe.name, rule, projections, skipped)
