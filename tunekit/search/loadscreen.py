"""The load test as a search's screening signal (``search.loadtest_screen``).

Before a trial's probe, the trial's rollout engine is load-tested (``tunekit loadtest`` with the recipe's
``loadtest:`` section: the engine alone, no training), once per rollout configuration (model and engine knobs,
:func:`tunekit.config.serving_key`): trials that share one reuse its record. The QPS at ``loadtest.at_concurrency``
becomes the trial's ``loadtest_qps``, and the record stays under the search's ``loadtests/`` directory, where the
report finds it beside the probes and says whether ranking by QPS agrees with ranking by the probes'
generation-phase times. A load test that cannot run is the trial's ``loadtest_error``; the probe runs all the same.
The load test's own GPU time is not priced into the probe budget.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tunekit import rundir
from tunekit.config import Recipe, serving_key
from tunekit.config.errors import TunekitError


def screen_dir(recipe: Recipe) -> Path:
    """Where the load test of ``recipe``'s rollout configuration lives: beside the search's probe runs."""
    rc = recipe.system.rollout.model_dump(mode="json")
    key = json.dumps(serving_key(rc, recipe.model.model_dump(mode="json")), default=str)
    return Path(recipe.probe.out).parent / rundir.SEARCH_LOADTESTS / hashlib.sha1(key.encode()).hexdigest()[:12]


def _qps(record: dict[str, Any]) -> float | None:
    at = record["pass_line"]["at_concurrency"]
    return next((r["qps"] for r in record["rows"] if r["concurrency"] == at), None)


def signal(recipe: Recipe) -> dict[str, Any]:
    """The trial's user attributes from the load test of its rollout configuration (run here unless a complete one
    is already on disk)."""
    from tunekit.loadtest import run_loadtest

    where = screen_dir(recipe)
    record = rundir.read_loadtest(where)
    if record is None or not record.get("complete"):
        try:
            run_loadtest(recipe, out_dir=where)
        except TunekitError as e:
            return {"loadtest_error": e.message}
        record = rundir.read_loadtest(where)
    if record is None:
        return {"loadtest_error": "the load test left no record"}
    out: dict[str, Any] = {"loadtest_dir": str(where), "loadtest_qps": _qps(record)}
    if record.get("stopped"):
        out["loadtest_error"] = record["stopped"]
    return out
