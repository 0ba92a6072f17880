"""Skip a sampled configuration the cost model puts far above the best so far, before paying for its probe.

Rule (``search.skip_by_estimate``, on by default): once at least :data:`MIN_PROBES` ok probes of the study
calibrate the cost model on the search's own GPU type, a configuration whose calibrated **low bound** of projected
full-run yuan (each phase at the fastest probe's efficiency, the shortest start-up) is over :data:`SKIP_FACTOR` x
the bar's (:func:`tunekit.search.budget.prune_bar`: the best feasible trial, or the cheapest trial of the
configuration's own learning within noise of the threshold) is not probed: status ``skipped``, reason ``estimated
too costly: ...``, recorded and shown as the memory verdict's ``would not fit`` skips are. A run that lasts until
the threshold is priced over the run length of the bar's trial where it shares the configuration's learning (the
length the probe would be read with). The rule stays out of the way when it cannot be sure: no bar yet, fewer
probes, a profile without the bandwidths the model needs, a run length that only a probe's reward curve can tell,
or a phase of the configuration that no probe of its own calibrated (its efficiency would be a stated default, or
for a compiled training path no probe ran, the eager probes' fit).
"""

from __future__ import annotations

from pathlib import Path

from tunekit.estimate import cost
from tunekit.config import Recipe
from tunekit.estimate.costmodel import calibrate, predict
from tunekit.estimate.costmodel.predict import unfitted
from tunekit.config.errors import TunekitError
from tunekit.estimate.profiles import PriceProfile
from tunekit.runners import runner_for
from tunekit.search.budget import PruneBar

SKIP_FACTOR = 2.0
"""The model's errors across configurations measured in tens of percent; twice the best leaves room for them."""
MIN_PROBES = 2


def too_costly(recipe: Recipe, profile: PriceProfile, run_dirs: list[str], bar: PruneBar | None) -> str | None:
    """Why ``recipe`` need not be probed (one sentence starting ``estimated too costly``), or None."""
    if bar is None or not recipe.search.skip_by_estimate or len(run_dirs) < MIN_PROBES:
        return None
    if recipe.run.until == "samples":
        length = cost.recipe_run_length(recipe, [])
    elif bar.steps is not None:  # the run length its learning reached the threshold in
        length = cost.RunLength(bar.steps, f"trial {bar.trial}'s, same learning")
    else:
        return None  # the run's length comes from the probe's own reward curve
    try:
        cal = calibrate([Path(d) for d in run_dirs], runners=runner_for, measured_on=profile)
        if cal.n < MIN_PROBES:
            return None
        pred = predict(recipe, profile, cal, length, runners=runner_for)
    except TunekitError:
        return None  # a profile without bandwidths, a model without shapes: no estimate, so no skip
    low = pred.yuan_low
    if unfitted(pred) or low is None or low <= SKIP_FACTOR * bar.yuan:
        return None
    return (f"estimated too costly: the cost model's low bound is {low:.4g} yuan over {length.steps} steps, over "
            f"{SKIP_FACTOR:g}x {bar.says()} (calibrated from {cal.n} probes of this search)")
