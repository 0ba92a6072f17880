"""Find a probe's processes by the run-dir tag every one of them inherits (Linux /proc)."""

from __future__ import annotations

from pathlib import Path

from tunekit.rundir import RUN_DIR_ENV


def probe_pids(run_dir: Path) -> dict[int, str]:
    """Live (non-zombie) processes tagged with ``run_dir``: pid → command line."""
    tag = f"{RUN_DIR_ENV}={Path(run_dir).resolve()}".encode()
    found = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if tag not in (d / "environ").read_bytes().split(b"\0"):
                continue
            stat = (d / "stat").read_text()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue
            found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
    return found


class ProcessWatch:
    """A ``run_probe`` progress callback that records every process of the probe it sees alive."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.seen: dict[int, str] = {}

    def __call__(self, steps_done: int) -> None:
        self.seen |= probe_pids(self.run_dir)
