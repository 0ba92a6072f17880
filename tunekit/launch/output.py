"""A probe's output (every process of it, stdout and stderr) into the run directory's log.txt.

What the user reads there: warnings, errors, tracebacks. Left out: the trace points kineto (torch.profiler's
backend) prints at every profiler start and stop ("USDT: ... profiler_start"), two lines per profiled phase;
they are printed at a level above kineto's own errors, so no log level drops them alone. Blank lines go too.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import IO

NOISE = (b"USDT:",)


def copy_output(src: IO[bytes], path: Path) -> threading.Thread:
    """Write ``src`` (a child's output pipe) to ``path`` line by line as it comes, without the profiler's trace points.

    The thread owns the file and ends when every process holding the pipe has closed it; join it before reading
    the log (a process that outlives the probe only delays the end of its own lines).
    """

    def run() -> None:
        with src, path.open("wb") as log:
            for line in iter(src.readline, b""):
                if line.strip() and not line.startswith(NOISE):
                    log.write(line)
                    log.flush()

    thread = threading.Thread(target=run, name=f"log:{path.parent.name}", daemon=True)
    thread.start()
    return thread
