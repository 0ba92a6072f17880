"""Hardware price profiles: one YAML file per GPU under ``profiles/``.

A profile says what one GPU-hour costs and what the GPU can do at peak. The
probe picks the profile whose ``nvml_pattern`` matches the device name NVML
reports, unless the user names one. An unmatched GPU gets no profile
(reported as "unknown"), never a guessed peak or price.
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunekit.config.datadirs import data_dir
from tunekit.config.errors import ConfigError

PROFILES_DIR = data_dir("profiles")
_SUFFIXES = (".yaml", ".yml")


class PriceProfile(BaseModel):
    """What one GPU (or one CPU "device") costs and can do."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(min_length=1)
    """Short id used on the command line, e.g. ``a100-40g``; equals the file stem."""
    nvml_pattern: str | None = Field(min_length=1)
    """Regex searched case-insensitively in the NVML device name; null never matches."""
    memory_gib: float | None = Field(gt=0, allow_inf_nan=False)
    """Device memory in GiB; null where it depends on the host (CPU)."""
    peak_bf16_tflops: float | None = Field(gt=0, allow_inf_nan=False)
    """Dense (no sparsity) BF16 tensor peak per GPU in TFLOP/s; null if unknown, so MFU is unknown."""
    yuan_per_gpu_hour: float = Field(gt=0, allow_inf_nan=False)
    """Rental price of one GPU for one hour, in yuan."""
    price_source: str = Field(min_length=1)
    """Where the price comes from: a URL of the quote, or a sentence starting with "Estimate"."""
    price_date: date | None = None
    """When the price was quoted or estimated (YYYY-MM-DD); prices drift, so a dated one can be judged."""
    peak_source: str = Field(min_length=1)
    """One sentence: where the peak comes from."""
    hbm_bandwidth_gbs: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Device-memory bandwidth in GB/s (10^9 bytes) from the datasheet; what bounds a decode step. Null: unknown."""
    interconnect_gbs: float | None = Field(None, gt=0, allow_inf_nan=False)
    """GPU-to-GPU bandwidth in GB/s, one direction (NVLink's datasheet figure counts both directions together: half
    of it; cards without NVLink talk over PCIe); what FSDP's collectives and a weight broadcast cross. Null: unknown."""
    host_link_gbs: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Host-to-GPU bandwidth in GB/s, one direction (PCIe x16 of the card's generation); what offload and a weight
    sync through host memory cross. Null: unknown."""
    bandwidth_source: str | None = Field(None, min_length=1)
    """One sentence: where the bandwidths come from."""
    device: Literal["gpu", "cpu"] | None = None
    """What the profile prices; null: a GPU where ``nvml_pattern`` names one, else a CPU (a GPU whose NVML name is
    unknown says ``gpu``)."""

    @field_validator("nvml_pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"is not a valid regular expression ({exc})") from exc
        return pattern

    @property
    def is_gpu(self) -> bool:
        """A GPU's profile: ``device: gpu``, or (unset) a pattern NVML names it by."""
        return self.device == "gpu" if self.device else self.nvml_pattern is not None

    def matches(self, nvml_name: str) -> bool:
        """Whether this profile describes the GPU NVML calls ``nvml_name``."""
        if self.nvml_pattern is None:
            return False
        return re.search(self.nvml_pattern, nvml_name, flags=re.IGNORECASE) is not None


def load_profile(name_or_path: str | os.PathLike[str]) -> PriceProfile:
    """Load a shipped profile by name (``a100-40g``) or a user profile by path."""
    text = os.fspath(name_or_path)
    if _looks_like_path(text):
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"{text}: price profile file not found — check the path.")
        return _read_profile(path)
    for suffix in _SUFFIXES:
        path = PROFILES_DIR / f"{text}{suffix}"
        if path.is_file():
            return _read_profile(path)
    available = ", ".join(_shipped_names()) or "none"
    raise ConfigError(
        f"No price profile named '{text}' in {_display(PROFILES_DIR)} (available: {available})"
        " — pick one of those or pass a path to a profile YAML."
    )


def list_profiles() -> list[PriceProfile]:
    """Every shipped profile, sorted by name; a broken one raises ConfigError."""
    return [_read_profile(path) for path in _shipped_paths()]


def match_profile(
    nvml_name: str, profiles: list[PriceProfile] | None = None
) -> PriceProfile | None:
    """The profile whose pattern matches ``nvml_name``, or None for an unknown GPU."""
    candidates = list_profiles() if profiles is None else profiles
    matched = [profile for profile in candidates if profile.matches(nvml_name)]
    if len(matched) > 1:
        names = ", ".join(profile.name for profile in matched)
        raise ConfigError(
            f"GPU '{nvml_name}' matches several price profiles ({names})"
            " — make their nvml_pattern keys exclusive or name a profile explicitly."
        )
    return matched[0] if matched else None


def _read_profile(path: Path) -> PriceProfile:
    where = _display(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed"
        raise ConfigError(f"{where}: not valid YAML{line} ({problem}) — fix the syntax.") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text — save the profile as UTF-8 YAML.") from exc
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the file ({exc.strerror}) — check the path.") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: a price profile must be a mapping of keys to values"
            f" ({', '.join(PriceProfile.model_fields)}) — fix the profile."
        )
    try:
        return PriceProfile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    """One sentence for the first problem pydantic found (every missing key at once, where keys are missing)."""
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = ", ".join(PriceProfile.model_fields)
        return f"unknown key '{key}' — remove it (allowed keys: {allowed})."
    if kind == "missing":
        missing = [".".join(map(str, e["loc"])) for e in exc.errors() if e["type"] == "missing"]
        keys = ", ".join(f"'{k}'" for k in missing)
        return f"missing key{'s' if len(missing) > 1 else ''} {keys} — add {'them' if len(missing) > 1 else 'it'} (use null where a value is unknown)."
    if kind.startswith(("float", "int")) or kind in ("greater_than", "finite_number"):
        expected = "null or a number > 0" if _nullable(key) else "a number > 0"
        return f"key '{key}' must be {expected}, got {error['input']!r} — fix the profile."
    if kind.startswith("string"):
        expected = "null or a non-empty string" if _nullable(key) else "a non-empty string"
        return f"key '{key}' must be {expected}, got {error['input']!r} — fix the profile."
    if kind == "value_error":
        return f"key '{key}' {error['ctx']['error']} — fix the profile."
    return f"key '{key}' {error['msg'].lower()} — fix the profile."


def _nullable(key: str) -> bool:
    field = PriceProfile.model_fields.get(key)
    return field is not None and type(None) in get_args(field.annotation)


def _looks_like_path(text: str) -> bool:
    return text.endswith(_SUFFIXES) or os.sep in text or "/" in text


def _shipped_paths() -> list[Path]:
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p for p in PROFILES_DIR.iterdir() if p.suffix in _SUFFIXES and p.is_file())


def _shipped_names() -> list[str]:
    return [path.stem for path in _shipped_paths()]


def _display(path: Path) -> str:
    """The path relative to the working directory when it is under it, else absolute."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)
