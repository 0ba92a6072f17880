"""Loading a recipe: a YAML file (or the embedded default), ``--set`` overrides, and validation errors as one
sentence that names the file and the key."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tunekit.config.base import RECIPES_DIR, Effect
from tunekit.config.recipe import Recipe, SearchConfig
from tunekit.config.system import SystemConfig
from tunekit.config.errors import ConfigError

# libyaml's parser and emitter where PyYAML was built with them: the same documents, several times faster (a search
# or a report writes and reads hundreds of recipes)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_value(text: str, item: str, source: str) -> Any:
    """An override value is YAML: ``4`` is an int, ``[0,1]`` a list, ``vllm`` a string (also where YAML cannot read
    it, such as ``[INST] {prompt}``); a list or a mapping left unclosed is a ConfigError naming ``item``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        if text.lstrip().startswith(("[", "{")) and text.count("[") + text.count("{") > text.count("]") + text.count("}"):
            problem = getattr(e, "problem", None) or "unreadable"
            raise ConfigError(f"{source} {item!r}: the value is not valid YAML ({problem}); close its brackets, "
                              "e.g. system.device_map={actor: [0], rollout: [1]}.") from None
        return text


def _text_value(text: str) -> str | None:
    """An override of a text key (a template, a prompt): the text as given, YAML's quoting and ``null`` aside, so
    ``Q: {question}`` is not read as a mapping."""
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return parsed if parsed is None or isinstance(parsed, str) else text


def _is_text(keys: list[str]) -> bool:
    """Whether a dotted key names a field that holds text (or null)."""
    model: Any = Recipe
    for k in keys[:-1]:
        field = getattr(model, "model_fields", {}).get(k)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return False
    field = getattr(model, "model_fields", {}).get(keys[-1])
    return field is not None and set(getattr(field.annotation, "__args__", (field.annotation,))) <= {str, type(None)}


def _known_path(keys: list[str]) -> bool:
    """Whether a dotted key names a field of the recipe (dicts such as device_map accept any key)."""
    model: Any = Recipe
    for i, k in enumerate(keys):
        fields = getattr(model, "model_fields", None)
        if fields is None or k not in fields:
            return False
        ann = fields[k].annotation
        sub = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub = ann
        if sub is None:
            return i == len(keys) - 1 or str(ann).startswith("dict")
        model = sub
    return True


def apply_overrides(raw: dict, overrides: list[str], *, source: str = "--set") -> dict:
    """Apply ``dotted.key=value`` strings to a raw recipe mapping (copy)."""
    data = yaml.load(yaml.dump(raw, Dumper=_DUMPER), Loader=_LOADER) or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected dotted.key=value, e.g. system.batch.micro_batch_size=4.")
        key, value = item.split("=", 1)
        keys = key.strip().split(".")
        if not _known_path(keys):
            near = difflib.get_close_matches(key.strip(), list_keys(), n=1, cutoff=0.8)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ConfigError(f"{source} {key!r}: no such key in the recipe; {hint}run `tunekit recipes --keys` to list them.")
        node = data
        if keys[:2] == ["system", "device_map"] and len(keys) == 3:
            # one role's devices: start from the default map instead of replacing it
            data.setdefault("system", {}).setdefault("device_map", SystemConfig().model_dump()["device_map"])
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source} {key!r}: {k!r} is not a section.")
        node[keys[-1]] = _text_value(value) if _is_text(keys) else _parse_value(value, item, source)
    return data


def _error_sentence(err: ValidationError, source: str, typed: Mapping[str, str] | None = None) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ").replace("Input should be", "it must be")
    if typed and where in typed:  # the value came from a command-line option: quote it as the user typed it
        return f"{typed[where]} (recipe key {where}): {msg}; give another value."
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key '{where}'; remove it or check the spelling (see `tunekit recipes --keys`)."
    if not first["loc"]:
        return f"{source}: {msg}; fix the recipe."
    got = first.get("input")
    got_txt = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{source}: key '{where}': {msg}{got_txt}; fix the value."


def recipe_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_dir():
        raise ConfigError(f"recipe {name_or_path!r} is a directory; give a recipe's YAML file or a shipped recipe's name.")
    if p.exists():
        return p
    for cand in (RECIPES_DIR / name_or_path, RECIPES_DIR / f"{name_or_path}.yaml"):
        if cand.exists():
            return cand
    names = ", ".join(sorted(x.stem for x in RECIPES_DIR.glob("*.yaml")))
    raise ConfigError(f"recipe {name_or_path!r} not found; give a YAML path or one of: {names}.")


def load_raw(name_or_path: str | None) -> tuple[dict, str]:
    if name_or_path is None:
        return {}, "(embedded default)"
    path = recipe_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the recipe as UTF-8 YAML.") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e}); give a readable recipe file.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{line} is not valid YAML ({getattr(e, 'problem', e)}); fix the syntax.") from None
    if raw is None:
        raise ConfigError(f"{path}: the recipe file is empty; write the sections to change (model, task, algorithm, system, "
                          "probe) or leave out --recipe to run the embedded default.")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections (model, task, algorithm, system, probe).")
    return raw, str(path)


def validate(raw: dict, source: str, typed: Mapping[str, str] | None = None) -> Recipe:
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_error_sentence(e, source, typed)) from None


def load_recipe(name_or_path: str | None = None, overrides: list[str] | None = None, *,
                typed: Mapping[str, str] | None = None) -> Recipe:
    """Recipe file (or the embedded default) + ``--set`` overrides → validated Recipe.

    ``typed``: for an override the command line made from one of its own options, its dotted key → the option as the
    user typed it (``{"probe.steps": "--steps 0"}``), so an error quotes that, not a ``--set`` nobody wrote.
    """
    raw, source = load_raw(name_or_path)
    data = apply_overrides(raw, overrides or [])
    if overrides:
        said = dict(typed or {})
        words = [said.get(o.split("=", 1)[0].strip(), f"--set {o}") for o in overrides]
        source = f"{source} with {' '.join(words)}"
    return validate(data, source, typed)


def dump_recipe(recipe: Recipe) -> str:
    """Fully resolved YAML (every default written out)."""
    return yaml.dump(recipe.model_dump(mode="json"), Dumper=_DUMPER, sort_keys=False)


def list_keys(model: type[BaseModel] = Recipe, prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann is not SearchConfig:
            out += list_keys(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def effect_of(key: str) -> Effect:
    """What a dotted recipe key changes (see :data:`Effect`): the field's own declaration, else its section's."""
    model: type[BaseModel] = Recipe
    for k in key.split("."):
        f = model.model_fields[k]
        declared = (f.json_schema_extra or {}).get("effect") if isinstance(f.json_schema_extra, dict) else None
        if declared:
            return declared
        ann = f.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return model.effect
        model = ann
    return model.effect


def what_runs(recipe: Recipe) -> dict[str, Any]:
    """Every key that changes what a training step runs (``learning`` and ``systems``), by dotted key."""
    data = recipe.model_dump(mode="json")
    out = {}
    for key in list_keys():
        if effect_of(key) != "probe":
            node: Any = data
            for k in key.split("."):
                node = node[k]
            out[key] = node
    return out
