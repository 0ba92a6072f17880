"""Everything a search checks before it creates anything, and the study it then opens.

Bad input raises ConfigError here, before the output directory or the study exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tunekit.config import Recipe, apply_overrides, validate
from tunekit.config.errors import ConfigError
from tunekit.config.load import what_runs
from tunekit.launch.probe import check_probe
from tunekit.estimate.profiles import PriceProfile
from tunekit.rundir import SEARCH_RUNS
from tunekit.search import references, space, storage as studies
from tunekit.search.checks import check_arguments
from tunekit.search.budget import KILL_GRACE_S, admitted_at, first_estimate, study_spent


@dataclass
class Setup:
    """The validated base recipe of a search and what its budget checks need."""

    base_raw: dict
    base: Recipe
    profile: PriceProfile
    source: str
    budget: float
    first_estimate: float
    gpu_profile: str | None


def probe_raw(recipe: Recipe, out_dir: Path) -> dict:
    raw = recipe.model_dump(mode="json")
    if recipe.search.probe_steps:
        raw["probe"]["steps"] = recipe.search.probe_steps
    raw["probe"]["out"] = str(out_dir / SEARCH_RUNS)
    return raw


def make_setup(recipe: Recipe, budget_yuan: float, trials: int, out_dir: Path, gpu_profile: str | None, source: str) -> Setup:
    check_arguments(recipe, budget_yuan, trials, source)
    raw = probe_raw(recipe, out_dir)
    base = validate(raw, source)
    profile = check_probe(base, gpu_profile=gpu_profile).profile
    if profile is None:
        raise ConfigError("this GPU matches no price profile, so probe spend can't be priced; pass --gpu-profile NAME (see `tunekit profiles`).")
    space.baseline_params(recipe.search.space, raw, source)
    for i, ref in enumerate(recipe.search.references):  # each runner's own refusals, before anything is created
        check_probe(validate(apply_overrides(raw, ref.set), f"{source}: search.references[{i}] {ref.name} set"),
                    gpu_profile=gpu_profile)
    if recipe.search.loadtest_screen:
        _check_screen(recipe, source)
    first = first_estimate(base.probe.timeout_s, base.system.world_size, profile)
    return Setup(raw, base, profile, source, budget_yuan, first, gpu_profile)


def _check_screen(recipe: Recipe, source: str) -> None:
    """A load test per trial needs a server to load: a URL, or vLLM and a GPU here to start one."""
    from tunekit.loadtest import pick_client
    from tunekit.loadtest.target import check_can_start

    pick_client(recipe)
    if not (recipe.loadtest.url or recipe.system.rollout.server_url):
        try:
            check_can_start(recipe)
        except ConfigError as e:
            raise ConfigError(f"{source}: search.loadtest_screen is on, but {e.message}") from None


KEPT = ("reward_threshold", "reward_window", "reward_metric", "probe_steps", "space", "references")
"""The search keys a study's trials were sampled and judged by: a resumed study keeps them (``confirm_seeds`` and
``confirm_top`` may grow: the round goes on)."""
KEPT_ATTR = "search_keys"
"""Study user attr: the :data:`KEPT` keys' values the study started with."""


def _kept(setup: Setup) -> dict[str, Any]:
    """What a resumed study keeps: the :data:`KEPT` search keys, every key that changes what a step runs (the
    configuration its baseline and space are read against) and the price profile its probes were priced with."""
    search = {k: v for k, v in setup.base.search.model_dump(mode="json").items() if k in KEPT}
    return search | {"recipe": what_runs(setup.base), "profile": setup.profile.name}


def _check_kept(old: dict[str, Any] | None, setup: Setup, name: str) -> None:
    """ConfigError naming the first kept key the resumed recipe (or profile) changes (a study from before a key was
    kept: not that key)."""
    new = _kept(setup)
    for k in KEPT:
        if old is not None and k in old and old[k] != new[k]:
            said = "differs from that of" if k in ("space", "references") else f"is {new[k]!r} but {old[k]!r} in"
            raise ConfigError(f"--resume: search.{k} in {setup.source} {said} study {name!r}, whose trials were "
                              "sampled and judged by it; start a new study (--study NEW_NAME) to change it "
                              "(search.confirm_seeds and search.confirm_top may grow: the round goes on).")
    was, now = (old or {}).get("recipe"), new["recipe"]
    # keys both know: a key a later tunekit added is not one the study's trials could have set
    if was is not None and (changed := next((k for k in sorted(set(was) & set(now)) if was[k] != now[k]), None)):
        raise ConfigError(f"--resume: {changed} in {setup.source} is {now.get(changed)!r} but {was.get(changed)!r} in "
                          f"study {name!r}, whose trials ran with it; resume with the same recipe and --set, or start "
                          "a new study (--study NEW_NAME).")
    if (old or {}).get("profile") not in (None, new["profile"]):
        raise ConfigError(f"--resume: the price profile is {new['profile']!r} but study {name!r} priced its probes "
                          f"with {old['profile']!r}; pass --gpu-profile {old['profile']} (or start a new study).")


def open_study(setup: Setup, storage: str | None, name: str, resume: bool, out_dir: Path, seed: int | None,
                n_trials: int) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """Every check before anything is created; then the study (when new, the baseline enqueued, the references of
    ``search.references`` kept to be enqueued when each fits the time left: :mod:`tunekit.search.references`) and the
    storage it lives in."""
    url = storage or studies.default_storage(out_dir)
    sqlite = url.startswith("sqlite:///")
    sqlite_file = sqlite and Path(url.removeprefix("sqlite:///")).exists()
    # a study database that is not there yet is created only once every check has passed
    if storage or resume:  # the default database's folder is made with the study
        studies.check_url(url, must_exist=resume)
    st = studies.open_storage(url, must_exist=resume) if (resume or sqlite_file or (storage and not sqlite)) else None
    exists = st is not None and studies.study_exists(st, name)
    if resume and not exists:
        raise ConfigError(f"--resume: no study named {name!r} in {studies.redact(url)}; run without --resume to start it (or pass --study NAME).")
    if not resume and exists:
        raise ConfigError(f"a study named {name!r} already exists in {studies.redact(url)}; pass --resume to continue it or --study NEW_NAME.")
    if exists:
        old_study = optuna.load_study(study_name=name, storage=st)
        _check_kept(old_study.user_attrs.get(KEPT_ATTR), setup, name)
        old = old_study.get_trials(deepcopy=False)
        left = setup.budget - study_spent(old_study, setup.profile)
        est = admitted_at(old, setup.first_estimate, setup.base.system.world_size, setup.profile)
        if left < est:
            raise ConfigError(f"--budget-yuan {setup.budget:g}: the study has spent {setup.budget - left:.4g} yuan and the next probe is "
                              f"estimated at {est:.4g} yuan; raise the budget to continue.")
    elif setup.budget < setup.first_estimate:
        raise ConfigError(f"--budget-yuan {setup.budget:g} is below one probe's estimated cost of {setup.first_estimate:.4g} yuan "
                          f"({setup.base.probe.timeout_s:g} s timeout and {KILL_GRACE_S:g} s to end it x {setup.base.system.world_size} device(s) at "
                          f"{setup.profile.yuan_per_gpu_hour:g} yuan/h, profile {setup.profile.name}); raise the budget or lower probe.timeout_s.")
    out_dir.mkdir(parents=True, exist_ok=True)
    st = st or studies.open_storage(url, must_exist=False)
    # a resumed seeded study goes on from where its proposals stopped rather than replay its first ones
    earlier = len(old) if exists else 0
    sampler = optuna.samplers.TPESampler(seed=None if seed is None else seed + earlier,
                                         n_startup_trials=min(10, max(3, n_trials // 3)), multivariate=True,
                                         group=True, constant_liar=True)
    study = optuna.create_study(storage=st, study_name=name, direction="minimize", sampler=sampler, load_if_exists=resume)
    kept = study.user_attrs.get(KEPT_ATTR) or {}
    if kept.keys() < _kept(setup).keys():  # a new study, or one from before some keys were kept: from here on
        study.set_user_attr(KEPT_ATTR, _kept(setup) | kept)
    if not exists:
        study.set_user_attr("recipe", setup.base.name)
        study.set_user_attr("probe_steps", setup.base.probe.steps)
        study.enqueue_trial(space.baseline_params(setup.base.search.space, setup.base_raw, setup.source), user_attrs={"baseline": True})
        references.keep(study, setup)
    study.set_user_attr("budget_yuan", setup.budget)
    return study, st
