"""A recipe's step time, memory and full-run cost on a GPU type, from the cost model and (when given) a calibration.

Phase seconds come from :func:`tunekit.estimate.costmodel.model.phases` at the calibrated efficiency of each phase's group
(else the stated default) plus its fitted launch cost; the step is their sum (the loop runs its phases one after
another), plus what the probes spent outside them per sample. The run's length is the recipe's ``run.*`` as the
search reads it (:func:`tunekit.estimate.cost.run_length`), priced with :func:`tunekit.estimate.cost.yuan` on every GPU the device
map holds. The memory verdict is :mod:`tunekit.estimate.memory`'s. The low bound takes each phase at its fastest probe's
efficiency and the shortest probed start-up.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunekit import metrics
from tunekit.estimate import cost, memory
from tunekit.config import Recipe, effect_of, what_runs
from tunekit.estimate.costmodel.calibrate import Calibration, ResponseLength
from tunekit.estimate.costmodel.model import (COMPILED_STREAM, DEFAULT_EFFICIENCY, DEFAULT_STARTUP_S, TRAINING_GROUPS, PhaseWork,
                                              default_efficiency, hardware, phases, shared_group, training_path)
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.estimate.profiles import PriceProfile
from tunekit.estimate.traits import Rules
from tunekit.rundir import find_configs, read_config, read_steps, read_summary


@dataclass(frozen=True)
class PhaseEstimate:
    name: str
    group: str
    seconds: float
    low_s: float
    efficiency: float
    launch_s: float
    probes: int
    """Probes the group's efficiency was fitted from; 0: the stated default."""
    divided: bool = True
    """Whether the phase has work an efficiency divides (a phase that moves nothing needs none)."""
    seen: bool = True
    """False: the probes were bound by their launches, so the efficiency is a default (:attr:`Fit.seen`)."""
    pass_s: float = 0.0
    """The fitted host cost of a model pass outside its blocks (:attr:`Fit.pass_s`)."""
    fitted_on: str = ""
    """The group whose fit priced the phase: its own, or for a compiled training pass no probe ran, the eager
    pass's (the same matmuls; its launches an upper bound); empty at the stated default."""
    bound: str = ""
    """What sets the phase's time: ``host`` (issuing the work) or ``device`` (doing it); empty with neither."""
    terms: tuple[tuple[str, float], ...] = ()
    """The phase's seconds by term, largest first: the side that bounds it, split into its pieces, and the serial
    costs beside it (:func:`phase_terms`)."""

    @property
    def borrowed(self) -> bool:
        """Priced at another group's fit (a compiled training pass at the eager probes')."""
        return bool(self.fitted_on) and self.fitted_on != self.group


@dataclass
class Prediction:
    recipe: str
    profile: str
    gpus: int
    phases: list[PhaseEstimate]
    other_s: float
    startup_s: float
    startup_low_s: float
    run: cost.RunLength
    memory: memory.MemoryEstimate
    probes: int
    assumptions: list[str] = field(default_factory=list)
    yuan_per_gpu_hour: float = 0.0
    overlap: bool = False
    """A phase takes the longer of its work and its launches (a GPU), not their sum (:attr:`Hardware.overlap`)."""
    path: str = "eager"
    """How the training passes run (:func:`tunekit.estimate.costmodel.model.training_path`)."""
    response: ResponseLength | None = None
    """The responses' mean length and how it was found (None: the ``task.max_new_tokens`` budget)."""

    @property
    def step_s(self) -> float:
        return sum(p.seconds for p in self.phases) + self.other_s

    @property
    def step_low_s(self) -> float:
        return sum(p.low_s for p in self.phases) + self.other_s

    def _run(self, step: float, startup: float) -> cost.Projection | None:
        """The full run at ``step`` seconds a step after ``startup`` (:func:`~tunekit.estimate.cost.project_run`, at
        this prediction's own yuan_per_gpu_hour); None when the run length is unknown."""
        if self.run.steps is None:
            return None
        return cost.project_run(startup_s=startup, step_times_s=[step], warmup_steps=0, target_steps=self.run.steps,
                                gpus_held=self.gpus, profile=self)

    @property
    def wall_s(self) -> float | None:
        return run.wall_s if (run := self._run(self.step_s, self.startup_s)) else None

    @property
    def wall_low_s(self) -> float | None:
        return run.wall_s if (run := self._run(self.step_low_s, self.startup_low_s)) else None

    @property
    def yuan(self) -> float | None:
        return run.yuan if (run := self._run(self.step_s, self.startup_s)) else None

    @property
    def yuan_low(self) -> float | None:
        return run.yuan if (run := self._run(self.step_low_s, self.startup_low_s)) else None

    @property
    def calibrated(self) -> bool:
        return self.probes > 0


def shape_of(recipe: Recipe) -> memory.ModelShape:
    """The policy's shapes (:func:`tunekit.estimate.memory.model_shape`); a ConfigError naming the model key when they can't be read."""
    m = recipe.model
    key = f"model.preset {m.preset!r}" if m.preset else f"model.path {m.path!r}" if m.path else "the embedded model"
    try:
        return memory.model_shape(recipe)
    except (ValueError, OSError, AttributeError, KeyError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}: the cost model cannot read its shapes ({first}); pick a preset of "
                          "tunekit.workload.models.PRESETS or a local checkpoint with a config.json.") from None


def learning_rewards(recipe: Recipe, dirs: list[Path]) -> list[list[float]]:
    """Reward curves of the ok probes under ``dirs`` whose learning keys equal the recipe's (systems knobs may differ)."""
    want = {k: v for k, v in what_runs(recipe).items() if effect_of(k) == "learning"}
    curves = []
    for cfg in sorted({c for d in dirs for c in find_configs(Path(d))}):
        try:
            run = read_config(cfg.parent)
        except TunekitError:
            continue
        if (read_summary(cfg.parent) or {}).get("status") != "ok":
            continue
        if {k: v for k, v in what_runs(run).items() if effect_of(k) == "learning"} == want:
            steps = read_steps(cfg.parent)
            if metrics.REWARD_MEAN in steps:
                curves.append(steps[metrics.REWARD_MEAN].tolist())
    return curves


def run_length(recipe: Recipe, curves: list[list[float]]) -> cost.RunLength:
    """The run's steps as the search reads them: ``run.samples`` over a step's samples, or until the threshold on
    the median of the matching probes' own curves (unknown without one)."""
    r = recipe
    lengths = [cost.recipe_run_length(r, c) for c in curves or [[]]]
    if r.run.until == "samples" or not curves:
        if r.run.until == "threshold":
            return cost.RunLength(None, "until the threshold: no probe of this learning configuration to read its "
                                        "reward curve, so the run length is unknown; --target-steps N prices N steps")
        return lengths[0]
    known = sorted(x.steps for x in lengths if x.steps is not None)
    if not known:
        return lengths[0]
    return cost.RunLength(known[len(known) // 2], f"the median of {len(known)} probe(s)' steps to the threshold")


def predict(recipe: Recipe, profile: PriceProfile, calibration: Calibration | None = None,
            run: cost.RunLength | None = None, *, runners: Rules, sampled: ResponseLength | None = None) -> Prediction:
    """The recipe on ``profile``'s GPUs (``runners``: its runner, which says what it resolves the training path to
    and what its framework does that the memory estimate counts; ``sampled``: the responses' length found before any
    probe, :mod:`tunekit.trainer.initial_responses`, which the calibration's probes of the workload override);
    ConfigError when the profile lacks what the model needs or the model has no shapes."""
    hw = hardware(profile)
    shape = shape_of(recipe)
    runner = runners(recipe)
    if hw.overlap:  # the CUDA graphs a probe on this card leaves out, as the memory verdict does
        recipe = memory.graphs_for_card(recipe, profile.memory_gib, shape, traits=runner.traits)
    cal = calibration if calibration is not None and calibration.n else None
    # what the runner runs: its training path, an old_logprob forward or not
    resolved = runner.training_path(recipe, gpu=hw.overlap)
    path = training_path(recipe, gpu=hw.overlap, runners=runners, resolved=resolved)
    out = []
    response = (cal.response_tokens(recipe) if cal else None) or sampled
    for name, w in phases(recipe, shape, hw, path=path, old_logprob=resolved.get("resolved/old_logprob"),
                          response=response.tokens if response else None).items():
        on = next((g for g in (w.group, shared_group(w.group)) if cal and g in cal.fits), "")
        f = cal.fits[on] if on else None
        eff, high, launch, per_pass = (f.efficiency, f.high, f.launch_s, f.pass_s) if f else \
            (default_efficiency(w.group), default_efficiency(w.group), 0.0, 0.0)
        bound, terms = phase_terms(w, eff, launch, per_pass, overlap=hw.overlap)
        out.append(PhaseEstimate(name, w.group, w.seconds(eff, launch, hw.overlap, per_pass),
                                 w.seconds(high, launch, hw.overlap, per_pass), eff, launch, f.probes if f else 0,
                                 w.ideal_s > 0, f.seen if f else True, per_pass, on, bound, terms))
    rows = recipe.system.batch.samples_per_step / max(1, len(recipe.system.device_map.get("actor") or [0]))
    other = statistics.median(cal.other_s_per_sample) * rows if cal and cal.other_s_per_sample else 0.0
    startup = statistics.median(cal.startup_s) if cal and cal.startup_s else DEFAULT_STARTUP_S
    startup_low = min(cal.startup_s) if cal and cal.startup_s else DEFAULT_STARTUP_S
    card = profile.memory_gib
    pred = Prediction(recipe.name, profile.name, recipe.system.world_size, out, other, startup, startup_low,
                      run or run_length(recipe, []), memory.estimate_memory(recipe, shape, card, traits=runner.traits),
                      cal.n if cal else 0,
                      yuan_per_gpu_hour=profile.yuan_per_gpu_hour, overlap=hw.overlap, path=path, response=response)
    pred.assumptions = assumptions(pred, cal) + _unpriced(recipe, pred)
    return pred


def _unpriced(recipe: Recipe, p: Prediction) -> list[str]:
    """What the model leaves out of this recipe's price, said so (a probe prices each)."""
    out = []
    if any(x.group.split("/")[:2] == ["gen", "hf"] and x.divided and not x.launch_s for x in p.phases):
        out.append("HF generate's launches are not priced without a probe of it: an eager decode step launches every "
                   "block's kernels for each token (about a millisecond a block on a GPU), so its generation is an "
                   "underestimate, by several times for long responses; a probe with system.rollout.backend hf "
                   "calibrates it")
    if recipe.evaluates:
        out.append(f"the held-out evaluations (every {recipe.probe.eval_every} steps) are not priced here; a probe's "
                   "projection prices them")
    if recipe.system.rollout.server_url:
        out.append("the rollout server at system.rollout.server_url is not priced: its GPUs are another machine's; "
                   f"the price is the trainer's {recipe.system.world_size} GPU(s)")
    return out


def phase_terms(w: PhaseWork, efficiency: float, launch_s: float, pass_s: float, *,
                overlap: bool) -> tuple[str, tuple[tuple[str, float], ...]]:
    """What sets ``w``'s time and its seconds by term, largest first: on a GPU the longer of the device's side
    (matmuls at ``efficiency``, the stated device terms) and the host's (the fitted launches, the stated host terms),
    on a CPU both; and the serial terms (the prefill, an engine's sleep or wake, the optimizer step, transfers)."""
    device, hosted = w.sides(efficiency, launch_s, pass_s)
    bound = "" if not (device or hosted) else "host" if hosted > device else "device"
    named = {side: [(n, v) for s, n, v in w.terms if s == side] for side in ("device", "host", "serial")}
    split = {
        "device": [(f"matmuls at {efficiency:.2g} of peak", w.ideal_s / efficiency if w.ideal_s else 0.0), *named["device"],
                   ("other device work", w.stream_s - sum(v for _, v in named["device"]))],
        "host": [("launches (fitted)", hosted - w.host_s), *named["host"],
                 ("other host work", w.host_s - sum(v for _, v in named["host"]))],
    }
    sides = ([bound] if overlap else ["device", "host"]) if bound else []
    serial = [*named["serial"], ("transfers", w.offset_s - sum(v for _, v in named["serial"]))]
    terms = [(n, v) for side in sides for n, v in split[side]] + serial
    return bound, tuple(sorted(((n, v) for n, v in terms if v > 1e-9), key=lambda x: -x[1]))


def assumptions(p: Prediction, cal: Calibration | None) -> list[str]:
    def launches(x: PhaseEstimate) -> str:
        if not x.launch_s:
            return ""
        host = f"{x.launch_s * 1e3:.3g} ms a block pass" + (f" + {x.pass_s * 1e3:.3g} ms a model pass" if x.pass_s else "")
        return f" ({host}, whichever is longer)" if p.overlap else f" (+{host})"

    used = ", ".join(f"{x.group} {x.efficiency:.3g}{launches(x)}" for x in {x.group: x for x in p.phases if x.divided}.values())
    used += (f"; training passes' elementwise traffic at {DEFAULT_EFFICIENCY['stream']:g} of the HBM bandwidth (stated), "
             "their efficiencies divide matmul FLOPs only")
    lines = [_path_line(p.path), _response_line(p)]
    if not p.overlap:
        lines.append(f"{p.profile} priced as a CPU, its launches and its work one after the other (a profile without "
                     "an nvml_pattern; `device: gpu` in it says it is a GPU's)")
    borrowed = sorted({x.group for x in p.phases if x.borrowed})
    paths = [g for g in borrowed if g.split("/", 1)[0] in TRAINING_GROUPS]
    if paths:
        lines.append(f"no probe ran {', '.join(paths)}: priced at the eager probes' fit (the same matmuls; their "
                     "launches make it an upper bound); a probe on this path calibrates it")
    if engines := [g for g in borrowed if g not in paths]:
        lines.append(f"no probe of this runner ran {', '.join(engines)}: priced at tunekit's trainer's fit of the same "
                     "engine, without the runner's own work around it; a probe of this runner calibrates it")
    if cal is None:
        return ["uncalibrated: no probe to fit efficiencies from; the stated defaults are used: " + used,
                f"start-up {DEFAULT_STARTUP_S:g} s (default); nothing outside the modelled phases (advantages, the reward "
                "function's own time)",
                *lines]
    fitted = sorted({x.fitted_on for x in p.phases if x.probes})
    defaults = sorted({x.group for x in p.phases if x.divided and not x.probes})
    lines = [f"calibrated from {cal.n} probe(s); efficiencies used: {used}", *lines]
    if defaults:
        lines.append(f"no probe ran {', '.join(defaults)}: the stated default efficiency there")
    hidden = sorted({x.group for x in p.phases if x.divided and x.probes and not x.seen})
    if hidden:
        lines.append(f"{', '.join(hidden)}: every probe was bound by its launches, so its work never showed; the stated "
                     "default efficiency there (at least what the probes allow); probe a larger batch to measure it")
    lines.append(f"fitted: {', '.join(fitted) or 'none'}; start-up {p.startup_s:.3g} s (median of {len(cal.startup_s)} probe(s)); "
                 f"{p.other_s:.3g} s a step outside the modelled phases")
    return lines


def _response_line(p: Prediction) -> str:
    if p.response is None:
        return ("responses charged the task.max_new_tokens budget: no probe of this workload (model and task) measured "
                "their length (`tunekit estimate --sample-responses N` samples the initial policy's)")
    return f"responses of {p.response.tokens:.3g} tokens on average, {p.response.source}"


def _path_line(path: str) -> str:
    if path == "eager":
        return "training passes run eager"
    graphs = ", replayed as CUDA graphs (no launches block by block)" if path == "graphs" else ""
    return (f"training passes compiled{graphs}: their elementwise traffic at {COMPILED_STREAM:g} of the eager "
            "count (fused kernels; stated), the gradients' fp32 accumulation whole")


def unfitted(p: Prediction) -> list[str]:
    """Efficiency groups no probe of their own calibrated though their phases have work to divide: at the stated
    default, or a compiled training pass at the eager probes' fit."""
    return sorted({x.group for x in p.phases if x.divided and x.fitted_on != x.group})


def compare(recipe: Recipe, profiles: list[PriceProfile], calibration: Calibration | None,
            run: cost.RunLength | None = None, *, runners: Rules,
            sampled: ResponseLength | None = None) -> list[Prediction]:
    """The recipe on each GPU type, cheapest full run first (an unknown cost last); ``runners`` and ``sampled`` as
    :func:`predict`."""
    preds = [predict(recipe, p, calibration, run, runners=runners, sampled=sampled) for p in profiles]
    return sorted(preds, key=lambda p: (p.memory.verdict == "would not fit", p.yuan is None, p.yuan or 0.0))
