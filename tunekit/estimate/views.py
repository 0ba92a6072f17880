"""Project a recipe's full-run cost without running anything: from earlier probes of the identical configuration
(:func:`estimate`, their step times repriced), or on any GPU type from the cost model (:func:`model_estimates`).

A run matches when its ``config.yaml`` resolves to the recipe's configuration in
every key that changes what a training step runs (``tunekit.config.what_runs``: the
learning and systems keys); keys that only change the probe (``probe.*``,
``profiler.*``, ``search.*``, the name) are set aside.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tunekit import metrics
from tunekit.estimate import cold_start, cost
from tunekit.config import Recipe, what_runs
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.estimate.profiles import PriceProfile, load_profile
from tunekit.rundir import find_configs, read_config, read_steps, read_summary

if TYPE_CHECKING:
    from tunekit.estimate.costmodel import Prediction
    from tunekit.estimate.costmodel.calibrate import ResponseLength
    from tunekit.estimate.traits import Rules


@dataclass
class RunProjection:
    run_dir: Path
    profile: str
    steps: int
    """Steps the probe ran."""
    run_steps: int
    """Steps of the full run it was projected to."""
    mean_step_s: float
    one_time_s: float
    """What the run pays once: start-up, teardown and the warm-up's excess (a cold start's where the probe started
    warm: :mod:`tunekit.estimate.cold_start`), as the projection priced it."""
    gpus_held: int
    wall_s: float
    gpu_hours: float
    yuan: float
    measured_on: str
    """The profile of the probe's own hardware (differs from ``profile`` when repriced)."""
    on_gpu: bool = True
    """Whether ``profile`` prices a GPU (its hours are GPU-hours), else a CPU device."""
    evaluation_s: float = 0.0
    """The run's held-out evaluations, as often as the probe's (in ``wall_s`` beside the steps and the one-time
    seconds)."""


@dataclass
class Estimate:
    recipe: str
    run_rule: str
    """How the full run's length was decided (``run.*``, or the ``--target-steps`` given)."""
    runs: list[RunProjection]
    skipped: int
    """Matching runs that did not end ok (no steady step times to project from), whose records are damaged, or
    that never reached the threshold of a run that lasts until it."""

    @property
    def yuan(self) -> float:
        return statistics.median(r.yuan for r in self.runs)

    @property
    def wall_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def gpu_hours(self) -> float:
        return statistics.median(r.gpu_hours for r in self.runs)


def _runs(runs_dir: Path | list[Path]) -> list[tuple[Path, Recipe]]:
    """Every run directory under ``runs_dir`` with the configuration it ran."""
    found = []
    dirs = runs_dir if isinstance(runs_dir, list) else [runs_dir]
    for cfg in sorted({c for d in dirs for c in find_configs(Path(d))}):
        try:
            found.append((cfg.parent, read_config(cfg.parent)))
        except (TunekitError, yaml.YAMLError):
            continue  # written by another version of tunekit, or not a run dir
    return found


def matching_runs(recipe: Recipe, runs_dir: Path | list[Path]) -> list[tuple[Path, Recipe]]:
    want = what_runs(recipe)
    return [(d, run) for d, run in _runs(runs_dir) if what_runs(run) == want]


def differing_keys(recipe: Recipe, runs_dir: Path | list[Path]) -> list[str]:
    """Where no probe under ``runs_dir`` ran ``recipe``'s configuration: the keys by which the probes of the same
    recipe name differ from it (each once, sorted), so the user sees which ``--set`` to give."""
    want, keys = what_runs(recipe), set()
    for _, run in _runs(runs_dir):
        if run.name == recipe.name:
            have = what_runs(run)
            keys |= {k for k in want.keys() | have.keys() if want.get(k) != have.get(k)}
    return sorted(keys)


def check_dirs(dirs: list[Path]) -> None:
    """Every ``--runs`` directory exists (a ConfigError naming the first that does not)."""
    for d in dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"--runs {d}: no such directory; point it at the runs directory of earlier probes.")


def _profile(name: str | None, summary: dict) -> PriceProfile | None:
    chosen = name or summary.get("profile")
    return load_profile(chosen) if chosen and chosen != "unknown" else None


def estimate(recipe: Recipe, *, runs_dir: str | Path | list[str | Path] = "runs", gpu_profile: str | None = None,
             target_steps: int | None = None, probe_command: str | None = None) -> Estimate:
    """Median projection over the ok probes of this recipe under ``runs_dir`` (one directory or several);
    ConfigError when there are none, naming ``probe_command`` (the probe of this configuration, as the user gave
    it; default ``tunekit probe --recipe NAME``) as the way to make one.

    The full run is the recipe's ``run.*`` (its samples, or until the threshold on each probe's own reward
    curve), or ``target_steps`` steps when given.

    ``gpu_profile`` reprices the measured step times; it does not convert them to other hardware.
    """
    dirs = [Path(d) for d in (runs_dir if isinstance(runs_dir, list) else [runs_dir])]
    check_dirs(dirs)
    projections, skipped, rule = [], 0, f"{target_steps} steps (given)"
    for run_dir, run in matching_runs(recipe, dirs):
        try:
            summary, steps = read_summary(run_dir) or {}, read_steps(run_dir)
        except Exception:  # noqa: BLE001 - a damaged record (pyarrow, json) is a run not to reprice, never the end
            skipped += 1
            continue
        profile = _profile(gpu_profile, summary)
        if summary.get("status") != "ok" or metrics.TIMING_STEP not in steps or profile is None:
            skipped += 1
            continue
        length = cost.recipe_run_length(recipe, metrics.reward_curve(steps, recipe.search.reward_metric))
        target = target_steps or length.steps
        if target is None:  # until the threshold, which this probe never reached
            skipped += 1
            continue
        rule = rule if target_steps else length.rule
        held = run.system.world_size
        p = cost.project_probe(steps, wall_s=float(summary.get("wall_s", 0.0)),
                               startup_s=float(summary.get("startup_s", 0.0)), warmup_steps=run.probe.warmup_steps,
                               target_steps=target, gpus_held=held, profile=profile,
                               overhead_s=summary.get(cold_start.PRICED),  # a cold start's, as its probe was priced
                               eval_every=run.probe.eval_every)
        projections.append(RunProjection(run_dir, profile.name, len(steps), target, p.mean_step_s,
                                         cost.one_time_s(p, target), held, p.wall_s, p.gpu_hours, p.yuan,
                                         str(summary.get("profile", "unknown")), profile.is_gpu, p.evaluation_s))
    if not projections:
        extra = f" ({skipped} matching run(s) did not end ok)" if skipped else ""
        if not skipped and (keys := differing_keys(recipe, dirs)):
            shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
            extra = f" (its probes there ran another configuration: they differ in {shown}; give the same --set)"
        raise ConfigError(f"no finished probe of recipe {recipe.name!r} under {', '.join(map(str, dirs))}{extra}; run "
                          f"`{probe_command or f'tunekit probe --recipe {recipe.name}'}` first or point --runs at its "
                          "runs directory.")
    return Estimate(recipe.name, rule, projections, skipped)


def check_model(recipe: Recipe, profiles: list[PriceProfile]) -> None:
    """What the cost model needs before it prints anything: every profile's peaks, and the model's shapes."""
    from tunekit.estimate.costmodel.model import hardware
    from tunekit.estimate.costmodel.predict import shape_of

    for p in profiles:
        hardware(p)
    shape_of(recipe)


def model_estimates(recipe: Recipe, profiles: list[PriceProfile], runs_dirs: list[str | Path],
                    target_steps: int | None = None, *, runners: Rules,
                    sampled: ResponseLength | None = None) -> list[Prediction]:
    """The cost model's estimate of ``recipe`` on each profile's GPUs (:mod:`tunekit.estimate.costmodel`), calibrated by the
    ok probes under ``runs_dirs`` (any configuration; none: uncalibrated), cheapest full run first. The run's length
    is ``target_steps`` when given, else the recipe's ``run.*`` (until the threshold: on the reward curves of
    probes with the same learning keys). ``runners``: a recipe's runner, which says what it resolves its training
    path to and what its framework does that the memory estimate counts; ``sampled``: the responses' length found
    before any probe, which probes of the workload override."""
    from tunekit.estimate.costmodel import calibrate, compare
    from tunekit.estimate.costmodel.predict import learning_rewards, run_length

    check_model(recipe, profiles)
    dirs = [Path(d) for d in runs_dirs]
    check_dirs(dirs)
    cal = calibrate(dirs, runners=runners, known=profiles)
    run = (cost.RunLength(target_steps, "given by --target-steps") if target_steps
           else run_length(recipe, learning_rewards(recipe, dirs)))
    preds = compare(recipe, profiles, cal, run, runners=runners, sampled=sampled)
    if cal.left_out:
        for p in preds:
            p.assumptions.append(f"{len(cal.left_out)} probe(s) left out of the calibration, e.g. {cal.left_out[0]}")
    return preds
