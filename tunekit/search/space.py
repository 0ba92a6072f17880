"""The search space of a recipe (``search.space``): checked up front, sampled per trial.

Each :class:`~tunekit.config.SearchParam` names a dotted recipe key. Values that
Optuna cannot store (lists, dicts such as a device map) travel as compact JSON
strings and are decoded back before they become ``--set`` overrides. A param
with ``when`` is only suggested when every ``when`` key has that value — the
value sampled earlier in this trial, or else the recipe's own (a list in
``when`` means "any of these").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import optuna
import yaml
from pydantic import ValidationError

from tunekit.config import Recipe, SearchParam, SearchReference, apply_overrides, validate
from tunekit.config.errors import ConfigError

_SCALARS = (str, int, float, bool, type(None))


def encode(value: Any) -> Any:
    """A value Optuna can store as a categorical choice (lists/dicts → canonical JSON)."""
    if isinstance(value, _SCALARS):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def lookup(data: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key of a (resolved) recipe mapping; KeyError when absent."""
    node: Any = data
    for k in key.split("."):
        node = node[k]
    return node


def override(key: str, value: Any) -> str:
    """``key=value`` whose value YAML parses back to ``value`` (strings stay bare when safe)."""
    value = decode(value)
    if isinstance(value, str) and yaml.safe_load(value) == value and "=" not in value:
        return f"{key}={value}"
    return f"{key}={json.dumps(value, separators=(',', ':'))}"


def overrides(params: Mapping[str, Any]) -> list[str]:
    return [override(k, v) for k, v in params.items()]


def _matches(cond: Any, actual: Any) -> bool:
    if isinstance(cond, list) and not isinstance(actual, list):
        return actual in cond
    return encode(cond) == encode(actual)


def active(param: SearchParam, chosen: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Whether ``param``'s ``when`` condition holds given the values chosen so far and the recipe's."""
    for key, cond in (param.when or {}).items():
        actual = decode(chosen[key]) if key in chosen else lookup(base, key)
        if not _matches(cond, actual):
            return False
    return True


def suggest(trial: optuna.Trial, space: list[SearchParam], base: Mapping[str, Any]) -> dict[str, Any]:
    """Ask Optuna for one value per active param, in space order (conditions see earlier picks)."""
    chosen: dict[str, Any] = {}
    for p in space:
        if not active(p, chosen, base):
            continue
        if p.type == "categorical":
            chosen[p.key] = trial.suggest_categorical(p.key, [encode(c) for c in p.choices or []])
        elif p.type == "int":
            chosen[p.key] = trial.suggest_int(p.key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        else:
            chosen[p.key] = trial.suggest_float(p.key, p.low, p.high, step=p.step, log=p.log)
    return chosen


def baseline_params(space: list[SearchParam], base: Mapping[str, Any], source: str, *,
                    what: str = "the recipe can be enqueued as the baseline") -> dict[str, Any]:
    """The recipe's own values for the active params: the first trial, enqueued as the baseline. ``what``: the end of
    the error sentence for a value outside the space (what it is needed for)."""
    chosen: dict[str, Any] = {}
    for i, p in enumerate(space):
        if not active(p, chosen, base):
            continue
        value = encode(lookup(base, p.key))
        if p.type == "categorical" and value not in [encode(c) for c in p.choices or []]:
            raise ConfigError(
                f"{source}: search.space[{i}] {p.key}: the recipe's own value {decode(value)!r} is not among the choices; "
                f"add it so {what}."
            )
        if p.type != "categorical" and not (isinstance(value, (int, float)) and p.low <= value <= p.high):
            raise ConfigError(
                f"{source}: search.space[{i}] {p.key}: the recipe's own value {value!r} is outside [{p.low}, {p.high}]; "
                f"widen the range so {what}."
            )
        chosen[p.key] = value
    return chosen


def reference_trial(ref: SearchReference, base: Mapping[str, Any], space: list[SearchParam],
                    source: str) -> tuple[dict[str, Any], list[str]]:
    """A reference (``search.references``) as a trial: its values of the active params, and its overrides of keys
    outside them (applied after the params)."""
    where = f"{source}: search.references {ref.name}"
    raw = apply_overrides(dict(base), ref.set, source=f"{where} set")
    params = baseline_params(space, raw, where, what=f"the reference {ref.name} can be enqueued")
    return params, [s for s in ref.set if s.split("=", 1)[0].strip() not in params]


def grid(space: list[SearchParam], base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of a categorical space (conditions applied); for exhaustive benchmarks."""
    combos: list[dict[str, Any]] = [{}]
    for p in space:
        if p.type != "categorical":
            raise ConfigError(f"search.space {p.key}: an exhaustive grid needs categorical params only.")
        nxt = []
        for c in combos:
            if active(p, c, base):
                nxt += [c | {p.key: encode(v)} for v in p.choices or []]
            else:
                nxt.append(c)
        combos = nxt
    return combos


# ---------------------------------------------------------------- checks


def _values_to_check(p: SearchParam) -> list[Any]:
    if p.type == "categorical":
        return list(p.choices or [])
    return [int(p.low) if p.type == "int" else p.low, int(p.high) if p.type == "int" else p.high]


def _check_shape(i: int, p: SearchParam, source: str) -> None:
    where = f"{source}: search.space[{i}] {p.key}"
    if p.type == "categorical":
        if not p.choices:
            raise ConfigError(f"{where}: categorical param has no choices; list at least one value under choices.")
        return
    if p.low is None or p.high is None:
        raise ConfigError(f"{where}: a {p.type} param needs both low and high; add them.")
    if p.low > p.high:
        raise ConfigError(f"{where}: empty range low={p.low} > high={p.high}; swap or widen them.")
    if p.log and p.low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0 (got {p.low}); raise low or drop log.")
    if p.type == "int" and (p.low != int(p.low) or p.high != int(p.high)):
        raise ConfigError(f"{where}: an int range needs whole-number low and high (got {p.low}, {p.high}).")


def _check_value(i: int, p: SearchParam, raw: dict, value: Any, source: str) -> None:
    """Apply ``key=value`` to the recipe and validate; only errors at this key count (combinations are per trial)."""
    data = apply_overrides(raw, [override(p.key, encode(value))], source=f"{source}: search.space[{i}]")
    try:
        Recipe.model_validate(data)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            if loc and (loc == p.key or loc.startswith(p.key + ".")):
                msg = err["msg"].removeprefix("Value error, ")
                raise ConfigError(f"{source}: search.space[{i}] {p.key}: value {value!r} is invalid ({msg}); fix the choices or range.") from None


def check_space(recipe: Recipe, source: str) -> None:
    """Every key exists, every range/choice list is non-empty and every value validates at its key."""
    raw = recipe.model_dump(mode="json")
    seen: set[str] = set()
    for i, p in enumerate(recipe.search.space):
        if p.key in seen:
            raise ConfigError(f"{source}: search.space[{i}] {p.key} appears twice; keep one entry per key.")
        if p.key.startswith("search."):
            raise ConfigError(f"{source}: search.space[{i}] {p.key}: the search section cannot be searched; pick a recipe key.")
        seen.add(p.key)
        _check_shape(i, p, source)
        for value in _values_to_check(p):
            _check_value(i, p, raw, value, source)
        for key in p.when or {}:
            apply_overrides(raw, [f"{key}=null"], source=f"{source}: search.space[{i}] when")
    if not recipe.search.space:
        raise ConfigError(f"{source}: search.space is empty; add at least one param to search over (see recipes/tiny-ppo.yaml).")
    check_references(recipe, source)


def check_references(recipe: Recipe, source: str) -> None:
    """Each reference has its own name, overrides only recipe keys outside ``search``, and gives a valid recipe whose
    values of the space's params are in the space (so it can be enqueued as a trial)."""
    raw, names = recipe.model_dump(mode="json"), set()
    for i, ref in enumerate(recipe.search.references):
        where = f"{source}: search.references[{i}] {ref.name}"
        if ref.name in names:
            raise ConfigError(f"{where}: the name appears twice; give each reference its own name.")
        names.add(ref.name)
        for item in ref.set:
            if item.split("=", 1)[0].strip().startswith("search."):
                raise ConfigError(f"{where}: set {item!r}: a reference cannot change the search section; pick a recipe key.")
        data = apply_overrides(raw, ref.set, source=f"{where} set")
        validate(data, f"{where} set")
        reference_trial(ref, raw, recipe.search.space, source)
