"""Phase efficiencies fitted from probes that already ran, with their spread.

Each ok probe under the given directories is read with the hardware it ran on (its summary's ``profile``, or the
one given): per phase, its steady median ``timing_s/<phase>`` against the model's count for the probe's own
configuration (:func:`tunekit.estimate.costmodel.model.phases`). Over the probes of one efficiency group,

    measured - offset - stream - host = ideal / efficiency + launches x launch_s

(``stream``: the pass's elementwise traffic and its kernels' fixed time at their stated costs, so the fitted
efficiency is the matmuls'; ``host``: the stated host costs of :mod:`~tunekit.estimate.costmodel.host`, so the
launch costs fitted are what the probes show beyond them; a training pass counts on the path its summary says it
ran, eager, compiled or replayed as CUDA graphs, each path a group of its own) is fitted by least squares with ``efficiency <= 1`` and ``launch_s >= 0`` (the host-bound cost of one
decoder-block pass) when the probes differ enough in work per launch to tell the two apart; where the fit finds the
work costing no time beyond its peak, the efficiency is 1 and the launch cost is fitted to the rest. Otherwise
``launch_s = 0`` and the efficiency is the median of the probes'. That sum is a CPU's: on a GPU the device works while
the host launches, so a phase takes the longer of the two (:func:`_fit_overlapped`), and where the probes bound by
their launches differ in depth (blocks a model pass), their time is split into a cost per block pass and one per model
pass (``pass_s``: embedding, LM head, sampling or loss), so a deeper model is not priced at a shallow one's rate.
Each probe's own efficiency under the fitted ``launch_s`` gives the spread (min, max). What a step spends outside the
modelled phases (reward, advantages, bookkeeping) is fitted per sample, and the start-up as the probes' median fixed
cost. The probes' mean response length (``response_length/mean`` over their steady steps) is kept per workload (the
model and the task: :func:`workload_key`), so a prediction of the same workload charges what its responses hold
rather than the ``task.max_new_tokens`` budget.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from tunekit import metrics
from tunekit.estimate import cost, memory
from tunekit.config import Recipe
from tunekit.estimate.costmodel.model import Hardware, default_efficiency, hardware, phases, training_path
from tunekit.config.errors import TunekitError
from tunekit.estimate.profiles import PriceProfile, load_profile
from tunekit.estimate.step_times import profiler_seconds
from tunekit.estimate.traits import Rules
from tunekit.rundir import find_configs, read_config, read_steps, read_summary

DISTINCT = 0.1
"""Probes whose work per launch differs by less than this share cannot tell efficiency from launch cost apart."""


@dataclass(frozen=True)
class Fit:
    efficiency: float
    launch_s: float
    low: float
    """The lowest of the probes' own efficiencies (the slowest)."""
    high: float
    probes: int
    seen: bool = True
    """False: every probe was bound by its launches, so its work never showed; the efficiency is the stated default,
    raised to the least the probes allow."""
    pass_s: float = 0.0
    """The host-bound cost of one model pass outside its blocks (GPU probes of different depths; else 0)."""


@dataclass
class Calibration:
    fits: dict[str, Fit] = field(default_factory=dict)
    other_s_per_sample: list[float] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)
    probes: list[Path] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """One line per run directory that could not calibrate, with the reason."""
    responses: dict[str, list[float]] = field(default_factory=dict)
    """Each probe's mean response length in tokens over its steady steps, by :func:`workload_key`."""

    @property
    def n(self) -> int:
        return len(self.probes)

    def response_tokens(self, recipe: Recipe) -> ResponseLength | None:
        """The median of the mean response lengths that probes of ``recipe``'s workload measured; None where none did."""
        found = self.responses.get(workload_key(recipe))
        if not found:
            return None
        return ResponseLength(statistics.median(found), f"as {len(found)} probe(s) of this workload measured them")


@dataclass(frozen=True)
class ResponseLength:
    """The tokens a response holds on average, and how that was found (a clause of the estimate's assumptions)."""

    tokens: float
    source: str


def workload_key(recipe: Recipe) -> str:
    """What sets how long a response runs, apart from how far training has gone: the model and the task (its prompts,
    templates, reward, sampling and budget). The system's knobs do not."""
    return json.dumps([recipe.model.path, recipe.model.preset, recipe.task.model_dump(mode="json")], sort_keys=True)


def steady_response_tokens(steps: pd.DataFrame, summary: dict) -> float | None:
    """A probe's mean response length in tokens, the median over its steady steps (its ``steps``, as
    :func:`~tunekit.rundir.read_steps` gives them; None where it recorded none)."""
    if metrics.RESPONSE_LENGTH_MEAN not in steps or "step" not in steps:
        return None
    steady = steps[steps["step"] >= summary.get("steady_from_step", 1)][metrics.RESPONSE_LENGTH_MEAN].dropna()
    return float(steady.median()) if len(steady) else None


@dataclass(frozen=True)
class Point:
    group: str
    measured: float
    offset: float
    ideal: float
    launches: float
    overlap: bool = False
    """Measured on a device that overlaps its work with the host's launches (:attr:`Hardware.overlap`)."""
    passes: float = 0.0
    stream: float = 0.0
    """Device work at a stated efficiency beside ``ideal`` (:attr:`PhaseWork.stream_s`)."""
    host: float = 0.0
    """Stated host time beside the launches (:attr:`PhaseWork.host_s`): the launch costs are fitted to what the
    probe shows beyond it."""


def fit(points: list[Point]) -> Fit | None:
    """The group's efficiency and launch cost (see the module docstring); None without ideal work to divide."""
    pts = [p for p in points if p.ideal > 0]
    if not pts:
        return None
    if all(p.overlap for p in pts):
        return _fit_overlapped(pts)
    ys = [max(p.measured - p.offset - p.stream - p.host, 1e-12) for p in pts]
    launch_s, fitted = 0.0, None
    per_launch = [p.ideal / p.launches for p in pts if p.launches]
    if len(per_launch) == len(pts) >= 2 and max(per_launch) > (1 + DISTINCT) * min(per_launch):
        a, launch_s = _least_squares([p.ideal for p in pts], [p.launches for p in pts], ys)
        if launch_s < 0:  # no launch cost to see: the efficiency alone
            launch_s = 0.0
        elif a < 1.0:  # faster than the peak allows: efficiency 1, the launch cost refitted to the rest
            fitted = 1.0
            launch_s = max(0.0, _least_squares_one([p.launches for p in pts], [y - p.ideal for y, p in zip(ys, pts)]))
        else:
            fitted = 1.0 / a
    effs = [min(1.0, p.ideal / max(y - launch_s * p.launches, 1e-12)) for p, y in zip(pts, ys)]
    # with a launch cost fitted, the efficiency is the fit's own: a probe whose time is nearly all launches leaves a
    # residual too small to divide (its own efficiency reads anywhere from 0 to 1), so a median of those is noise
    return Fit(statistics.median(effs) if fitted is None else fitted, launch_s, min(effs), max(effs), len(pts))


def _fit_overlapped(pts: list[Point]) -> Fit:
    """``measured - offset = max(ideal / efficiency + stream, launches x launch_s)``: each probe is bound by its work
    or by its launches. The pair is searched among the probes' own values (each probe's time per launch, each one's
    efficiency were it work-bound) for the least squared log error. A probe never bound by its work says only that the efficiency
    is at least its own: with none, the stated default is used, raised to that least (``seen`` False); with none
    bound by its launches, the launch cost is 0."""
    ys = [max(p.measured - p.offset, 1e-12) for p in pts]
    per_launch = [max(y - p.host, 0.0) / p.launches for p, y in zip(pts, ys) if p.launches]
    effs = [min(1.0, p.ideal / max(y - p.stream, 1e-12)) for p, y in zip(pts, ys)]
    work = lambda p, eff: p.ideal / eff + p.stream  # noqa: E731
    hosted = lambda p, launch_s: p.launches * launch_s + p.host  # noqa: E731

    def loss(launch_s: float, eff: float) -> float:
        return sum((math.log(y) - math.log(max(work(p, eff), hosted(p, launch_s), 1e-12))) ** 2 for p, y in zip(pts, ys))

    launch_s, eff = min(((ls, e) for ls in [0.0, *per_launch] for e in [*effs, 1.0]), key=lambda c: (loss(*c), -c[1], c[0]))
    work_bound = [work(p, eff) > hosted(p, launch_s) for p in pts]
    own = [e for e, bound in zip(effs, work_bound) if bound]  # efficiencies only work-bound probes measured
    if not own:  # the work never showed: the default, but no lower than the probes allow
        eff = min(1.0, max(default_efficiency(pts[0].group), max(effs)))
    if all(work_bound):
        launch_s = 0.0
    launch_s, pass_s = _split_launches([(p, max(y - p.host, 0.0)) for p, y, bound in zip(pts, ys, work_bound) if not bound],
                                       launch_s)
    return Fit(eff, launch_s, min(own, default=eff), max(own, default=eff), len(pts), bool(own), pass_s)


def _split_launches(bound: list[tuple[Point, float]], launch_s: float) -> tuple[float, float]:
    """``(launch_s, pass_s)`` from the probes bound by their launches, ``time = blocks x launch_s + passes x pass_s``
    by least squares, when their depths (block passes a model pass) differ enough to tell the two apart and both
    come out positive; else the single ``launch_s`` and no pass cost."""
    pts = [(p, y) for p, y in bound if p.launches and p.passes]
    depth = [p.launches / p.passes for p, _ in pts]
    if len(pts) < 2 or max(depth) <= (1 + DISTINCT) * min(depth):
        return launch_s, 0.0
    block, per_pass = _least_squares([p.launches for p, _ in pts], [p.passes for p, _ in pts], [y for _, y in pts])
    return (block, per_pass) if block > 0 and per_pass > 0 else (launch_s, 0.0)


def _least_squares(x1: list[float], x2: list[float], y: list[float]) -> tuple[float, float]:
    s11 = sum(a * a for a in x1)
    s22 = sum(b * b for b in x2)
    s12 = sum(a * b for a, b in zip(x1, x2))
    s1y = sum(a * c for a, c in zip(x1, y))
    s2y = sum(b * c for b, c in zip(x2, y))
    det = s11 * s22 - s12 * s12
    if det <= 0:
        return 1.0, -1.0
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def _least_squares_one(x: list[float], y: list[float]) -> float:
    den = sum(a * a for a in x)
    return sum(a * b for a, b in zip(x, y)) / den if den else 0.0


def probe_points(recipe: Recipe, steady: dict, hw: Hardware, path: str = "eager",
                 response: float | None = None, old_logprob: bool | None = None) -> tuple[list[Point], float | None]:
    """One probe's points (its training passes on ``path``, an ``old_logprob`` pass where the probe ran one: as its
    summary's ``resolved/old_logprob`` says, else where it timed one; its responses at their measured mean length
    ``response`` where known), and what its step spent outside the modelled phases per sample on its busiest GPU. A
    runner's ``old_logprob`` time without that forward (TRL's scoring of the batch) counts as outside the phases."""
    shape = memory.model_shape(recipe)
    ran = steady.get(metrics.timing("old_logprob")) is not None if old_logprob is None else old_logprob
    work = phases(recipe, shape, hw, path=path, old_logprob=ran, response=response)
    points = [Point(w.group, float(steady[metrics.timing(name)]), w.offset_s, w.ideal_s, w.launches, hw.overlap, w.passes,
                    w.stream_s, w.host_s)
              for name, w in work.items() if steady.get(metrics.timing(name)) is not None]
    step = steady.get(metrics.TIMING_STEP)
    if step is None:
        return points, None
    rows = recipe.system.batch.samples_per_step / max(1, len(recipe.system.device_map.get("actor") or [0]))
    rest = float(step) - sum(float(steady.get(metrics.timing(name)) or 0.0) for name in work)
    return points, max(rest, 0.0) / rows


def calibrate(dirs: list[Path], *, runners: Rules, measured_on: PriceProfile | None = None,
              known: list[PriceProfile] | None = None, exclude: set[Path] | None = None) -> Calibration:
    """Fit from every ok probe under ``dirs`` (searched recursively). ``runners``: a probe's runner, which says what
    it resolves its training path to for a summary that does not record it. ``measured_on``: the hardware they ran
    on, instead of each summary's profile; ``known``: profiles to find a summary's profile name among before the
    shipped ones (a user's profile file); ``exclude``: run directories to leave out."""
    by_name = {p.name: p for p in known or []}
    cal, points = Calibration(), []
    for cfg in sorted({c for d in dirs for c in find_configs(Path(d))}):
        run_dir = cfg.parent
        if exclude and run_dir.resolve() in exclude:
            continue
        try:
            summary = read_summary(run_dir) or {}
        except (ValueError, OSError) as e:  # a half-written or damaged summary: no probe to fit
            cal.left_out.append(f"{run_dir}: summary.json unreadable ({e})")
            continue
        if summary.get("status") != "ok" or not summary.get("steady"):
            continue
        try:
            recipe = read_config(run_dir)
            name = str(summary.get("profile", "unknown"))
            profile = measured_on or by_name.get(name) or load_profile(name)
            if not profile.is_gpu and profile.peak_bf16_tflops is None:  # whatever profile the estimate prices with
                cal.left_out.append(f"{run_dir}: ran on the CPU, whose profile {profile.name!r} gives no peaks to fit "
                                    "against (a CPU probe calibrates only with a CPU profile of your own that has them)")
                continue
            hw = hardware(profile)
            steps = read_steps(run_dir)
            response = steady_response_tokens(steps, summary)
            pts, other = probe_points(recipe, summary["steady"], hw,
                                      training_path(recipe, gpu=hw.overlap, runners=runners, resolved=summary),
                                      response, old_logprob=summary.get("resolved/old_logprob"))
        except (TunekitError, ValueError, yaml.YAMLError) as e:
            cal.left_out.append(f"{run_dir}: {getattr(e, 'message', e)}")
            continue
        points += pts
        cal.probes.append(run_dir)
        if response is not None:
            cal.responses.setdefault(workload_key(recipe), []).append(response)
        if other is not None:
            cal.other_s_per_sample.append(other)
        if metrics.TIMING_STEP in steps:
            cal.startup_s.append(cost.fixed_cost_s(
                wall_s=float(summary.get("wall_s", 0.0)), startup_s=float(summary.get("startup_s", 0.0)),
                step_times_s=steps[metrics.TIMING_STEP].tolist(), profiler_s=profiler_seconds(steps)))
    for group in sorted({p.group for p in points}):
        f = fit([p for p in points if p.group == group])
        if f is not None:
            cal.fits[group] = f
    return cal
