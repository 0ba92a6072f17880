"""Background NVML sampling of GPU memory, utilisation, power and energy.

This is the only tunekit module that imports ``pynvml`` (package
``nvidia-ml-py``). NVML sees every process on a GPU, so ``mem_used_gb``
includes memory the PyTorch allocator does not know about (a vLLM engine or
server, NCCL buffers, CUDA contexts), and also what other jobs sharing the card
hold. Where NVML names the processes on a GPU, the sampler tells the probe's own
(its process tree: ranks, engines, servers) from the others', and the summary adds
the probe's own peak (:func:`own_peaks`): what the card would show with the probe
alone on it.

GPU indices are NVML indices, which ignore ``CUDA_VISIBLE_DEVICES``.
Without NVML (no driver, no GPU, no pynvml) the sampler is disabled: it warns
once, records the reason, and returns empty samples.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

import psutil

from tunekit import metrics
from tunekit.metrics import GIB

if TYPE_CHECKING:  # imported where samples become a frame: a process that samples none skips it
    import pandas as pd

COLUMNS = ["time", "node", "gpu", "mem_used_gb", "util_gpu", "power_w", "sm_clock_mhz", "proc_mem_used_gb"]
PROCESS_COLUMNS = ["time", "gpu", "pid", "used_gb", "own"]
TREE_REFRESH_S = 2.0
"""How often the sampler looks up the probe's process tree again (and at once when NVML names a process it has not
placed)."""


def process_tree(root: int) -> set[int]:
    """``root`` and every process under it; empty when ``root`` is gone."""
    try:
        return {root, *(child.pid for child in psutil.Process(root).children(recursive=True))}
    except psutil.Error:
        return set()


def own_peaks(samples: pd.DataFrame, processes: pd.DataFrame) -> dict[int, float]:
    """Per GPU, the peak (GiB) of what the probe's own processes hold plus what no process holds (the driver's
    share, which a card with the probe alone also shows), over the samples where NVML named the processes. Only the
    GPUs on which NVML named at least one of the probe's processes: where it names none (another PID namespace), the
    probe's share is unknown."""
    own = processes["own"].astype(bool)
    gpus = set(processes.loc[own, "gpu"])
    if not gpus:
        return {}
    per = (processes.assign(own_gb=processes["used_gb"].where(own, 0.0))
           .groupby(["time", "gpu"], as_index=False).agg(all_gb=("used_gb", "sum"), own_gb=("own_gb", "sum")))
    named = samples.dropna(subset=["proc_mem_used_gb"])[["time", "gpu", "mem_used_gb"]].merge(per, on=["time", "gpu"])
    named = named.assign(alone_gb=named["own_gb"] + (named["mem_used_gb"] - named["all_gb"]).clip(lower=0.0))
    return {int(gpu): float(rows["alone_gb"].max()) for gpu, rows in named.groupby("gpu") if gpu in gpus}


def _import_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class NvmlSampler:
    """Context manager that samples GPUs on a background thread.

    One row per GPU per sample in :attr:`samples` with columns :data:`COLUMNS`
    (``time`` is epoch seconds; ``node`` the node, of a probe spanning several, that holds the GPU;
    ``proc_mem_used_gb`` is the sum of per-process memory NVML reports, NaN when it reports none). Per-process rows are in
    :attr:`process_samples`. Energy per GPU comes from NVML's energy counter
    (difference between enter and exit), or from integrating sampled power
    when the counter is unsupported. If NVML fails mid-run, sampling stops,
    :attr:`error` says why, and the caller's work carries on.
    """

    def __init__(self, gpus: Sequence[int] | None = None, *, interval_s: float = 0.2,
                 nodes: Mapping[int, int] | None = None, root: int | None = None) -> None:
        """Args:
        gpus: NVML indices to sample; None samples every GPU NVML sees.
        interval_s: seconds between samples; must be > 0.
        nodes: NVML index -> node, for a probe spanning several nodes (a GPU not named is on node 0); the
            summary then names each GPU by node and index and adds each node's totals.
        root: the process whose tree is the probe's own; default the leader of this process's session (a probe
            runs as a session of its own, so its ranks, engines and servers are all under it).
        """
        if not interval_s > 0:
            raise ValueError(
                f"NvmlSampler interval_s must be a positive number of seconds, got {interval_s!r}."
            )
        self.interval_s = float(interval_s)
        self.gpus: list[int] = list(gpus) if gpus is not None else []
        self.nodes = dict(nodes) if nodes is not None else None
        self._all_gpus = gpus is None
        self.available = False
        self.reason: str | None = None
        self.error: str | None = None
        self.samples: list[dict[str, float]] = []
        self.process_samples: list[dict[str, float]] = []
        self.energy_j: dict[int, float] = {}
        self.energy_method: str | None = None
        self._nvml: ModuleType | None = None
        self._handles: dict[int, Any] = {}
        self._energy_start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.root = os.getsid(0) if root is None else root
        self._tree: set[int] = set()
        self._others: set[int] = set()
        self._tree_at = -math.inf

    def __enter__(self) -> NvmlSampler:
        nvml = _import_pynvml()
        if nvml is None:
            return self._disable("pynvml (nvidia-ml-py) is not installed")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return self._disable(f"NVML could not start ({exc})")
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            if self._all_gpus:
                self.gpus = list(range(count))
            missing = [g for g in self.gpus if not 0 <= g < count]
            if missing:
                raise ValueError(f"NvmlSampler gpus {missing} do not exist; NVML sees {count} GPU(s).")
            if not self.gpus:
                nvml.nvmlShutdown()
                self._nvml = None
                return self._disable("NVML sees no GPU")
            self._handles = {g: nvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
        except Exception:
            nvml.nvmlShutdown()
            self._nvml = None
            raise
        self._energy_start = self._read_energy_mj() or {}
        self.available = True
        self._thread = threading.Thread(target=self._run, name="tunekit-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.available or self._nvml is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None:
            self._sample_guarded()  # a closing sample so short runs have two points
        end = self._read_energy_mj() if self.error is None else None
        if self._energy_start and end:
            self.energy_j = {g: (end[g] - self._energy_start[g]) / 1000.0 for g in end}
            self.energy_method = "counter"
        else:
            self.energy_j = self._integrate_power()
            self.energy_method = "power_integral" if self.energy_j else None
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down a broken NVML must not mask the caller's result
            pass

    def _disable(self, reason: str) -> NvmlSampler:
        self.reason = reason
        warnings.warn(f"NVML sampling disabled: {reason}.", RuntimeWarning, stacklevel=3)
        return self

    def _run(self) -> None:
        while self._sample_guarded() and not self._stop.wait(self.interval_s):
            pass

    def _sample_guarded(self) -> bool:
        try:
            self._sample()
        except Exception as exc:
            self.error = f"NVML sampling stopped after {len(self.samples)} rows: {exc!r}"
            return False
        return True

    def _field(self, fn: Any, *args: Any) -> float:
        """One NVML reading; NaN where this GPU does not support it."""
        not_supported = getattr(self._nvml, "NVMLError_NotSupported", ())
        try:
            return float(fn(*args))
        except not_supported:
            return math.nan

    def _sample(self) -> None:
        nvml = self._nvml
        assert nvml is not None
        now = time.time()
        for gpu, handle in self._handles.items():
            self.samples.append({
                "time": now,
                "node": self.node(gpu),
                "gpu": gpu,
                "mem_used_gb": nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
                "util_gpu": self._field(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle),
                "power_w": self._field(nvml.nvmlDeviceGetPowerUsage, handle) / 1000.0,
                "sm_clock_mhz": self._field(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                "proc_mem_used_gb": self._sample_processes(now, gpu, handle),
            })

    def _sample_processes(self, now: float, gpu: int, handle: Any) -> float:
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)  # type: ignore[union-attr]
        except Exception:  # optional: unsupported, or no permission inside containers
            return math.nan
        known = [p for p in procs if getattr(p, "usedGpuMemory", None) is not None]
        tree = self._probe_tree(now, {p.pid for p in known})
        for p in known:
            self.process_samples.append(
                {"time": now, "gpu": gpu, "pid": p.pid, "used_gb": p.usedGpuMemory / GIB, "own": p.pid in tree}
            )
        return sum(p.usedGpuMemory for p in known) / GIB if known else math.nan

    def _probe_tree(self, now: float, pids: set[int]) -> set[int]:
        """The probe's process tree, looked up again every :data:`TREE_REFRESH_S` or when a process started since."""
        if now - self._tree_at > TREE_REFRESH_S:
            self._tree, self._others, self._tree_at = process_tree(self.root), set(), now
        elif not pids <= self._tree | self._others:
            self._tree = process_tree(self.root)
        self._others |= pids - self._tree
        return self._tree

    def _read_energy_mj(self) -> dict[int, float] | None:
        """Energy counters in mJ, or None if any GPU lacks them."""
        try:
            return {
                g: float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # type: ignore[union-attr]
                for g, h in self._handles.items()
            }
        except Exception:
            return None

    def _integrate_power(self) -> dict[int, float]:
        frame = self.to_frame().dropna(subset=["power_w"])
        energy: dict[int, float] = {}
        for gpu, rows in frame.groupby("gpu"):
            if len(rows) >= 2:
                t, p = rows["time"].to_numpy(), rows["power_w"].to_numpy()
                energy[int(gpu)] = float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum())
        return energy

    def to_frame(self) -> pd.DataFrame:
        """Samples as a DataFrame with :data:`COLUMNS` (empty but typed when disabled)."""
        import pandas as pd

        return pd.DataFrame(list(self.samples), columns=COLUMNS).astype({"node": "int64", "gpu": "int64"})

    def process_frame(self) -> pd.DataFrame:
        """Per-process memory samples with :data:`PROCESS_COLUMNS`."""
        import pandas as pd

        return pd.DataFrame(list(self.process_samples), columns=PROCESS_COLUMNS)

    def write_parquet(self, path: str | Path) -> None:
        """Write :meth:`to_frame` to ``path`` (also when empty)."""
        self.to_frame().to_parquet(path, index=False)

    def node(self, gpu: int) -> int:
        return (self.nodes or {}).get(gpu, 0)

    def label(self, gpu: int) -> str:
        """How the summary names a GPU: its NVML index, or ``node<N>.gpu<I>`` when the probe spans nodes."""
        return str(gpu) if self.nodes is None else f"node{self.node(gpu)}.gpu{gpu}"

    def summary(self) -> dict[str, Any]:
        """``nvml/available``, ``nvml/energy_j`` (None if unknown), and per GPU (:meth:`label`)
        ``nvml/energy_j/<gpu>``, ``nvml/mem_used_gb/<gpu>`` (peak), ``nvml/util_mean/<gpu>``; plus
        ``nvml/reason`` / ``nvml/error`` when set. Spanning nodes, per node ``nvml/node<N>/energy_j``,
        ``nvml/node<N>/mem_used_gb`` (its GPUs' highest peak) and ``nvml/node<N>/util_mean``."""
        out: dict[str, Any] = {
            "nvml/available": self.available,
            "nvml/energy_j": sum(self.energy_j.values()) if self.energy_j else None,
            "nvml/energy_method": self.energy_method,
        }
        for gpu, joules in sorted(self.energy_j.items()):
            out[f"nvml/energy_j/{self.label(gpu)}"] = joules
        frame = self.to_frame()
        for gpu, rows in frame.groupby("gpu"):
            out[metrics.nvml_mem_used(self.label(int(gpu)))] = float(rows["mem_used_gb"].max())
            out[f"nvml/util_mean/{self.label(int(gpu))}"] = float(rows["util_gpu"].mean())
        for gpu, peak in own_peaks(frame, self.process_frame()).items():
            out[metrics.nvml_own_mem_used(self.label(gpu))] = peak
        if self.nodes is not None:
            for node, rows in frame.groupby("node"):
                joules = [j for g, j in self.energy_j.items() if self.node(g) == node]
                out[f"nvml/node{node}/energy_j"] = sum(joules) if joules else None
                out[f"nvml/node{node}/mem_used_gb"] = float(rows["mem_used_gb"].max())
                out[f"nvml/node{node}/util_mean"] = float(rows["util_gpu"].mean())
        if self.reason is not None:
            out["nvml/reason"] = self.reason
        if self.error is not None:
            out["nvml/error"] = self.error
        return out


def merge_node_summaries(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One probe's NVML record from its nodes' samplers' summaries (each node sampled its own GPUs): the
    per-GPU and per-node keys side by side, the energy summed, available only if every node sampled."""
    out: dict[str, Any] = {}
    for part in parts:
        out |= {k: v for k, v in part.items() if k not in ("nvml/available", "nvml/energy_j")}
    energies = [p.get("nvml/energy_j") for p in parts]
    out["nvml/available"] = bool(parts) and all(p.get("nvml/available") for p in parts)
    out["nvml/energy_j"] = sum(energies) if parts and None not in energies else None
    return out


NO_GPU = {"nvml/available": False, "nvml/reason": "no NVIDIA GPU in this probe (CPU run)"}


def probe_summary(sampler: NvmlSampler | None) -> dict[str, Any]:
    """A probe's NVML record in summary.json: its sampler's summary, or that the probe held no GPU."""
    return sampler.summary() if sampler is not None else dict(NO_GPU)


def launcher_peaks(summary: Mapping[str, Any], launcher: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher's NVML peaks (``nvml/mem_used_gb/<gpu>``, marked ``nvml/source: launcher``) for a probe whose own
    record has none: it was killed at its time limit, ran out of memory or crashed before writing its result. Empty
    when the probe recorded its own peaks or the launcher sampled nothing."""
    if any(k.startswith("nvml/mem_used_gb/") for k in summary):
        return {}
    peaks = {k: v for k, v in launcher.items() if k.startswith(("nvml/mem_used_gb/", "nvml/own_mem_used_gb/"))}
    return peaks | {"nvml/source": "launcher"} if peaks else {}


def save_samples(sampler: NvmlSampler | None, path: Path) -> None:
    """Write a probe's samples to its run directory's NVML file, when NVML sampled anything."""
    if sampler is not None and sampler.available:
        sampler.write_parquet(path)


def gpu_names() -> list[str]:
    """NVML names of the GPUs on this machine ([] without NVML): picks the price profile."""
    return _each_gpu(lambda nvml, h: str(nvml.nvmlDeviceGetName(h)))


def gpu_uuids() -> list[str]:
    """NVML UUIDs of the GPUs on this machine ([] without NVML): which physical GPUs a probe ran on."""
    return _each_gpu(lambda nvml, h: str(nvml.nvmlDeviceGetUUID(h)))


def _each_gpu(read: Callable[[Any, Any], str]) -> list[str]:
    """``read(pynvml, handle)`` of each GPU on this machine, [] without NVML or its driver."""
    nvml = _import_pynvml()
    if nvml is None:
        return []
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver means no GPUs
        return []
    try:
        return [read(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()
