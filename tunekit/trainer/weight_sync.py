"""Weight sync by collective: actor rank 0 broadcasts the full weights to every rollout replica.

The actor and rollout groups each have their own default process group, so the sync
group is a separate, stateless one (its own TCP store): actor rank 0 is its rank 0, the
rollout workers follow. NCCL on GPU (device to device, no host copy), gloo on CPU, where
it runs the same code path as a test. The object-store path
(:class:`tunekit.trainer.worker_group.RemoteWeights`) needs no group at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

Manifest = list[tuple[str, tuple[int, ...], str]]
"""(name, full shape, dtype name) of every tensor actor rank 0 sends, in sending order."""


def stateless_group(host: str, port: int, rank: int, world: int, device: torch.device,
                    timeout: timedelta = timedelta(minutes=10)) -> dist.ProcessGroup:
    """A process group outside the default one; rank 0 hosts its store at ``host:port``."""
    store = dist.PrefixStore("tunekit-weight-sync/", dist.TCPStore(host, port, world, rank == 0, timeout=timeout))
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, world)
    return dist.ProcessGroupGloo(store, rank, world, timeout)


def manifest(model: torch.nn.Module) -> Manifest:
    """What :func:`send` will send for ``model`` (full shapes of FSDP shards), without gathering."""
    from tunekit.trainer.parallel import _clean_name

    return [(_clean_name(n), tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in model.state_dict().items()]


def send(group: dist.ProcessGroup | None, named_params: Iterable[tuple[str, torch.Tensor]], device: torch.device) -> int:
    """Broadcast each full tensor from rank 0 of ``group`` (from ``device``); returns bytes sent.

    Every actor rank iterates ``named_params`` (the FSDP gathers are collectives of the
    actor group); only rank 0, the one with a ``group``, broadcasts.
    """
    sent = 0
    for _, tensor in named_params:
        if group is None:
            continue
        t = tensor.detach().to(device).contiguous()  # offloaded parameters gather on the host
        group.broadcast(t, 0).wait()
        sent += t.numel() * t.element_size()
    return sent


def receive(group: dist.ProcessGroup, items: Manifest, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) as each broadcast from rank 0 arrives, in manifest order."""
    for name, shape, dtype in items:
        buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(buf, 0).wait()
        yield name, buf
