"""Read what probes and searches left on disk into plain objects; the only I/O of the report (files through
:mod:`tunekit.rundir`'s lenient readers, studies through Optuna).

A PATH may be one run directory (``summary.json`` / ``config.yaml``), a runs
directory, or a search output directory (``runs/``, ``search.json``,
``study.db``). Anything unreadable or absent is recorded as missing, never
fatal: the report shows what is there and says what is not.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tunekit import rundir
from tunekit.config.errors import TunekitError
from tunekit.report import check_paths


@dataclass
class Probe:
    """One run directory as read from disk."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    steps: pd.DataFrame
    nvml: pd.DataFrame
    missing: list[str] = field(default_factory=list)
    """Files that are absent or unreadable, each as one phrase."""
    samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    """What the model said (samples.parquet): step, prompt, response, answer, reward."""
    eval_samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    """What it answered the held-out prompts (eval_samples.parquet): trained_steps, prompt, response, answer, reward."""

    @property
    def id(self) -> str:
        return self.run_dir.name


@dataclass
class StudyRecord:
    """The trials of an Optuna study, and its parameter importances or why there are none."""

    name: str
    storage: str
    trials: list[dict[str, Any]]
    importance: dict[str, float] | None
    importance_note: str = ""
    result: dict[str, Any] | None = None
    """The search's final search.json as its confirming worker kept it in the study (``search_result``)."""


@dataclass
class Records:
    probes: list[Probe]
    searches: list[dict[str, Any]] = field(default_factory=list)
    """Each search.json, with its directory under ``_dir``."""
    study: StudyRecord | None = None
    notes: list[str] = field(default_factory=list)
    loadtests: list[dict[str, Any]] = field(default_factory=list)
    """Each loadtest.json (``tunekit loadtest``), with its path under ``_path``."""


def read_probe(run_dir: Path) -> Probe:
    f = rundir.read_lenient(run_dir)
    return Probe(Path(run_dir), f.config, f.summary, f.steps, f.nvml, f.missing, f.samples, f.eval_samples)


def read_loadtests(roots: list[Path]) -> list[dict[str, Any]]:
    """Every ``loadtest.json`` under ``roots``, with its path under ``_path`` (unreadable ones left out)."""
    out = []
    for root in roots:
        for path in rundir.find_loadtests(Path(root)) if Path(root).is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("rows"), list):
                out.append({**record, "_path": str(path)})
    return out


def load_records(paths: list[Path], *, storage: str | None = None, study: str | None = None) -> Records:
    """Read every probe, search.json and study under ``paths``.

    Raises TunekitError for a path that does not exist or holds no runs, and for a
    study that cannot be opened. Missing files inside a run are notes, not errors.
    """
    if study and not storage:
        raise TunekitError(f"--study {study!r} needs --storage URL (e.g. sqlite:///search-out/study.db).")
    if not paths and not storage:
        raise TunekitError("nothing to report: give a runs directory, a search output directory or --storage URL --study NAME.")
    check_paths(paths)
    run_dirs: list[Path] = []
    searches: list[dict[str, Any]] = []
    study_dbs: list[Path] = []
    for root in paths:
        root = Path(root)
        found = rundir.find_run_dirs(root) if root.is_dir() else []
        if not found:
            raise TunekitError(
                f"{root} has no probe runs (no <run>/summary.json or config.yaml under it); "
                "give a runs directory or a search output directory."
            )
        run_dirs += found
        searches += [s for s in map(rundir.read_search_lenient, rundir.find_search_results(root)) if s]
        study_dbs += [p for p in (rundir.study_db(Path(s["_dir"])) for s in searches) if p.exists()]
    unique = list(dict.fromkeys(p.resolve() for p in run_dirs))
    records = Records(probes=[read_probe(p) for p in unique], searches=searches, loadtests=read_loadtests(list(paths)))
    if storage:
        records.study = load_study(storage, study)
    elif len(set(study_dbs)) == 1:
        found = load_study(f"sqlite:///{study_dbs[0].resolve()}", None, quiet=True)
        if found is not None:  # named as the user gave the path: an absolute local path says nothing to a reader
            found.storage = f"sqlite:///{study_dbs[0]}"
        records.study = found
    elif len(set(study_dbs)) > 1:
        records.notes.append("several study.db files found; search history is read from search.json (give --storage/--study for one).")
    if records.study is not None and not records.probes:
        records.probes = _probes_of_study(records.study)
    if records.study is not None and records.study.result and not records.searches:  # the study's own answer
        records.searches = [records.study.result]
    return records


def _probes_of_study(study: StudyRecord) -> list[Probe]:
    dirs = [Path(t["run_dir"]) for t in study.trials if t.get("run_dir")]
    return [read_probe(d) for d in dirs if d.is_dir()]


def _holds_studies(sqlite_url: str) -> bool:
    """Whether a SQLite file has Optuna's ``studies`` table, read without writing (Optuna would create its tables)."""
    import sqlite3

    path = sqlite_url.removeprefix("sqlite:///")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='studies'").fetchone() is not None
    except sqlite3.Error:
        return False


def _public_url(url: str) -> str:
    """The storage URL without its password (it ends up in a shared HTML file)."""
    head, sep, tail = url.partition("://")
    if "@" in tail:
        cred, host = tail.rsplit("@", 1)
        tail = f"{cred.split(':', 1)[0]}:***@{host}"
    return head + sep + tail


def load_study(storage: str, name: str | None, *, quiet: bool = False) -> StudyRecord | None:
    """Trials and importances of an Optuna study; with ``quiet``, None instead of raising."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    where = _public_url(storage)
    try:
        if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
            raise TunekitError(f"--storage {where}: no such SQLite file; give the study.db a search wrote.")
        if storage.startswith("sqlite:///") and not _holds_studies(storage):  # reading it must not write Optuna's tables
            raise TunekitError(f"--storage {where}: not a study database (no Optuna tables); give the study.db a search wrote.")
        from tunekit.search.storage import driver_url  # the driver a search's PostgreSQL URL is opened with

        storage = driver_url(storage)
        names = optuna.study.get_all_study_names(storage)
        if name is None:
            if not names:
                raise TunekitError(f"--storage {where} holds no study; give the storage a search wrote its study to.")
            if len(names) != 1:
                raise TunekitError(f"--storage {where} holds {len(names)} studies ({', '.join(names)}); name one with --study.")
            name = names[0]
        if name not in names:
            raise TunekitError(f"--study {name!r} is not in {where} (it holds: {', '.join(names) or 'none'}).")
        study = optuna.load_study(study_name=name, storage=storage)
    except TunekitError:
        if quiet:
            return None
        raise
    except ImportError:
        if quiet:
            return None
        raise TunekitError(f"--storage {where} needs its database driver; install it (pip install -e '.[postgres]').") from None
    except Exception as e:  # noqa: BLE001 - any storage failure is one sentence to the user
        if quiet:
            return None
        raise TunekitError(f"--storage {where} can't be read ({type(e).__name__}: {str(e)[:200]}); check the URL.") from None
    trials = [_trial_dict(t) for t in study.get_trials(deepcopy=False)]
    importance, note = _importance(study, trials)
    kept = study.user_attrs.get("search_result")
    return StudyRecord(name, where, trials, importance, note, kept if isinstance(kept, dict) else None)


def _trial_dict(t: Any) -> dict[str, Any]:
    """A trial as plain data; ``bound``: (projected yuan, step) it last reported, the projection the search
    pruned a trial at."""
    constraints = t.constraints
    feasible = all(v <= 0 for v in constraints.values()) if constraints else t.user_attrs.get("feasible")
    return {
        "number": t.number, "state": t.state.name.lower(), "params": dict(t.params), "value": t.value,
        "feasible": feasible, "reason": t.user_attrs.get("reason", ""), "run_dir": t.user_attrs.get("run_dir"),
        "spend_yuan": t.user_attrs.get("probe_yuan", t.user_attrs.get("spend_yuan")),
        "status": t.user_attrs.get("status"),
        "bound": (lambda step: (t.intermediate_values[step], step))(max(t.intermediate_values)) if t.intermediate_values else None,
    }


def _importance(study: Any, trials: list[dict[str, Any]]) -> tuple[dict[str, float] | None, str]:
    """Importances over complete trials with a finite objective: an OOM or crash scores +inf and would swamp the rest."""
    import optuna

    # each configuration once, and none priced by knobs outside the space (a reference's): their spread is no knob's
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value) and "duplicate_of" not in t.user_attrs
            and not t.user_attrs.get("reference")]
    if len(done) < 2:
        return None, f"the study has {len(done)} complete trial(s) with a finite projected cost; importance needs at least 2."
    if not any(t.params for t in done):
        return None, "the complete trials have no sampled parameters (only the enqueued baseline?)."
    finite = optuna.create_study(directions=study.directions)
    finite.add_trials(done)
    try:
        with warnings.catch_warnings():  # "few trials per regime": the note below says how many there were
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(finite)
    except Exception as e:  # noqa: BLE001 - Optuna refuses degenerate studies in many ways
        return None, f"Optuna could not compute importances ({type(e).__name__}: {str(e)[:200]})."
    return {k: float(v) for k, v in found.items()}, f"over {len(done)} complete trials with a finite projected cost"
