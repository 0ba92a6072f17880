"""Run benchmark commands side by side, each on its own GPUs ("jobs"), and pack what they wrote.

    python3 benchmarks/side_by_side.py --out DIR --limit SECONDS "GPUS :: SCRIPT ARGS" ["GPUS :: ..."]...

Each job runs ``python3 benchmarks/SCRIPT ARGS --out DIR/jobK`` (or ``python3 -m tunekit ARGS ...`` when
SCRIPT is ``tunekit``) with ``CUDA_VISIBLE_DEVICES=GPUS``
(tunekit maps device-map indices through it, so a job's probes use its GPUs only), in its own
process group; a job still running at ``--limit`` is killed (what it wrote so far stays). At the end
every table a job wrote is printed and the small files (tables, JSON, step records, logs; no traces)
go into ``--pack`` as one tar.gz. Jobs share a host: compare rows of one job, or rows of jobs of
one invocation, never across invocations.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = (".md", ".json", ".jsonl", ".parquet", ".txt", ".log", ".yaml", ".db")
MAX_BYTES = 4 << 20


def parse_job(spec: str) -> tuple[str, list[list[str]]]:
    """'GPUS :: SCRIPT ARGS [;; SCRIPT ARGS]...' → (GPUS, commands run one after the other)."""
    gpus, _, cmds = spec.partition("::")
    if not cmds.strip():
        raise SystemExit(f"jobs: {spec!r} is not 'GPUS :: SCRIPT ARGS' (e.g. '0,1 :: matrix.py gpu15')")
    return gpus.strip(), [shlex.split(c) for c in cmds.split(";;") if c.strip()]


def job_script(cmds: list[list[str]], out: Path) -> str:
    """The shell lines a job runs: each command with ``--out`` its job directory, the next one regardless."""
    lines = []
    for cmd in cmds:
        script = ["-m", "tunekit"] if cmd[0] == "tunekit" else [str(HERE / cmd[0])]
        lines.append(shlex.join([sys.executable, *script, *cmd[1:], "--out", str(out)]))
    return "\n".join(lines)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), whatever session they started, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, ``pid`` and everything below it. Probes run in sessions of their own
    (start_new_session), so a killpg of the job would leave them on the GPU, into the next call."""
    tree = [pid, *descendants(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for each in tree:
            try:
                os.kill(each, sig)
            except ProcessLookupError:
                pass
        time.sleep(grace_s)


def pack(out: Path, dest: Path) -> int:
    """Tar the small files under ``out`` into ``dest``; returns how many went in."""
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and p.suffix in SMALL and "traces" not in p.parts
             and p.stat().st_size <= MAX_BYTES and p.resolve() != dest.resolve()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=str(p.relative_to(out.parent)))
    return len(files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=float, default=540.0, help="seconds before jobs still running are killed")
    ap.add_argument("--pack", type=Path, help="tar.gz of the small files (default: $OUT/<out name>.tgz)")
    ap.add_argument("jobs", nargs="+")
    args = ap.parse_args()
    jobs = [parse_job(s) for s in args.jobs]
    args.out.mkdir(parents=True, exist_ok=True)
    procs = []
    t0 = time.monotonic()
    for k, (gpus, cmd) in enumerate(jobs):
        job_out = args.out / f"job{k}"
        job_out.mkdir(exist_ok=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus, PYTHONUNBUFFERED="1")
        log = (job_out / "job.log").open("w")
        script = job_script(cmd, job_out)
        log.write(f"GPUs {gpus}:\n{script}\n")
        log.flush()
        procs.append((k, gpus, subprocess.Popen(["bash", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True, cwd=HERE.parent)))
        print(f"job{k} GPUs {gpus}: {' ;; '.join(' '.join(c) for c in cmd)}", flush=True)
    while any(p.poll() is None for _, _, p in procs) and time.monotonic() - t0 < args.limit:
        time.sleep(2)
    for k, _, p in procs:
        if p.poll() is None:
            print(f"job{k}: still running at --limit {args.limit:g} s, killed", flush=True)
            kill_tree(p.pid)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        print(f"job{k}: exit {p.returncode} after {time.monotonic() - t0:.0f} s", flush=True)
    for md in sorted(args.out.glob("job*/*.md")):
        print(f"\n## {md.relative_to(args.out)}\n{md.read_text()}")
    dest = args.pack or Path(os.environ.get("OUT", args.out)) / f"{args.out.name}.tgz"
    print(f"packed {pack(args.out, dest)} files into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
