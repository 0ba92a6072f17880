"""Role worker groups on Ray, placed by the device map, behind the local roles' interface.

A :class:`WorkerGroup` has the methods the loop calls on a local role. It splits
each batch into equal contiguous shards, one per worker (data parallel, the same
split spmd ranks use), waits for every worker (``ray.get``) and joins the results,
so a phase timed around a call on the driver lasts as long as the slowest worker.

Placement follows verl / OpenRLHF: one placement-group bundle per device index of
the map; a worker of a role takes ``1/k`` of its bundle when ``k`` workers share that
device (colocated roles time-share a GPU). A rollout replica of several GPUs (tensor
parallel) is one worker holding one bundle of all its GPUs. On CPU the bundles hold one
logical CPU each and a device index names a slot, not hardware. With ``system.nnodes`` > 1
a bundle also asks for its node's ``nodeN`` resource, so each worker runs on the node that holds its
devices (:mod:`tunekit.placement.nodes`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tunekit.config import Recipe
from tunekit.placement.nodes import NODE_RESOURCE, node_of
from tunekit.trainer.batch import Batch, select
from tunekit.placement.backends import backend_of
from tunekit.trainer.workers import RoleWorker
from tunekit.workload.reward import merge_extra


class WorkerDied(RuntimeError):
    """A worker process ended (crash, OOM killer) while the driver waited on it."""


@dataclass
class RemoteWeights:
    """The actor's full weights in the Ray object store; the driver holds only the reference."""

    ref: ray.ObjectRef

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs, for a consumer in the driver process (e.g. a vLLM server client)."""
        return iter(ray.get(self.ref).items())


@dataclass
class CollectiveWeights:
    """The actor group's weights, broadcast from its rank 0 when the rollout group receives them."""

    actor: WorkerGroup


def _shards(batch: Batch, n: int) -> list[Batch]:
    rows = next(iter(batch.values())).shape[0]
    if rows % n:
        raise ValueError(f"a batch of {rows} rows does not split over {n} workers")
    size = rows // n
    return [select(batch, slice(i * size, (i + 1) * size)) for i in range(n)]


class WorkerGroup:
    """The ranks of one role; rank ``r`` runs on ``devices[r]`` (a rollout replica: the first of its devices)."""

    def __init__(self, role: str, workers: list, devices: list[int]) -> None:
        self.role, self.workers, self.devices = role, workers, devices
        self.info: list[dict[str, Any]] = []
        self.sync_manifest: list | None = None
        """Set by :func:`link_collective_sync`: weights move by broadcast instead of the object store."""
        self.last_metrics: dict[str, float] = {}
        """What the rollout replicas' engines reported of the last generation, averaged over them."""
        self.last_extra: dict[str, tuple[float, int]] = {}
        """What the reward workers' dict returns gave beside their scores in the last call, added up."""

    @property
    def world(self) -> int:
        return len(self.workers)

    def _get(self, refs: list) -> list:
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(f"{self.role} worker died ({str(e).splitlines()[0]}); its last output is in log.txt") from None

    def _map(self, method: str, batch: Batch, **kwargs: Any) -> list:
        return self._get([getattr(w, method).remote(s, **kwargs) for w, s in zip(self.workers, _shards(batch, self.world))])

    def _all(self, method: str, *args: Any) -> list:
        return self._get([getattr(w, method).remote(*args) for w in self.workers])

    # ------------------------------------------------------------ the local roles' interface

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return torch.cat(self._map("logprobs", batch))

    def values(self, batch: Batch) -> torch.Tensor:
        return torch.cat(self._map("values", batch))

    def update(self, batch: Batch, *, mini_batch: int, seed: int) -> dict[str, float]:
        """Every rank steps on its shard with its share of the mini-batch; metrics are averaged over ranks."""
        results = self._map("update", batch, mini_batch=mini_batch // self.world, seed=seed)
        return {k: sum(r[k] for r in results) / len(results) for k in results[0]}

    def generate(self, prompts: Batch, *, seed: int, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Each replica samples its shard with ``seed + rank``, as spmd rank ``rank`` would."""
        calls = [w.generate.remote(s, seed=seed + r, greedy=greedy)
                 for r, (w, s) in enumerate(zip(self.workers, _shards(prompts, self.world)))]
        out = self._get(calls)
        self.last_metrics = mean_metrics([m for _, _, m in out])
        logps = [lp for _, lp, _ in out]
        return torch.cat([ids for ids, _, _ in out]), None if None in logps else torch.cat(logps)

    def score(self, prompts: list, texts: list[str]) -> torch.Tensor:
        size = len(prompts) // self.world
        calls = [w.score.remote(prompts[r * size:(r + 1) * size], texts[r * size:(r + 1) * size])
                 for r, w in enumerate(self.workers)]
        out = self._get(calls)
        self.last_extra = merge_extra([extra for _, extra in out])
        return torch.cat([scores for scores, _ in out])

    def named_full_params(self) -> RemoteWeights | CollectiveWeights:
        """Gather full weights on rank 0 (every rank joins the FSDP gathers); they stay in the object store.

        With a collective sync nothing moves yet: the rollout group's :meth:`sync_weights` runs the broadcast.
        """
        if self.sync_manifest is not None:
            return CollectiveWeights(self)
        refs = [w.full_state_dict.remote() for w in self.workers]
        self._get(refs[1:])  # all ranks done gathering; rank 0's result is not fetched to the driver
        ray.wait(refs[:1], fetch_local=False)
        return RemoteWeights(refs[0])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's full weights, fetched to the caller (every rank joins the gathers; rank 0's are returned)."""
        return self._get([w.full_state_dict.remote() for w in self.workers])[0]

    def sync_weights(self, params: RemoteWeights | CollectiveWeights | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights into every replica; returns the bytes they received."""
        if isinstance(params, CollectiveWeights):
            sends = [w.broadcast_weights.remote() for w in params.actor.workers]
            received = [w.receive_weights.remote(params.actor.sync_manifest) for w in self.workers]
            params.actor._get(sends)
            return sum(self._get(received))
        ref = params.ref if isinstance(params, RemoteWeights) else ray.put(dict(params))
        return sum(self._all("sync_weights", ref))

    def sleep(self) -> None:
        self._all("sleep")

    def wake(self) -> None:
        self._all("wake")

    # ------------------------------------------------------------ probe support

    def inject_fault(self, fault: str, step: int) -> None:
        self._all("inject_fault", fault, step)

    def peak_memory(self) -> list[dict[str, float]]:
        return self._all("peak_memory")


def role_slots(recipe: Recipe, role: str) -> list[list[int]]:
    """The devices of each worker of ``role``: one device per rank, except the rollout group's
    (:meth:`~tunekit.placement.backends.BackendSpec.rollout_workers`: replicas of
    ``system.rollout.tensor_parallel_size`` devices each)."""
    sysc = recipe.system
    if role == "rollout":
        return backend_of(sysc.rollout).rollout_workers(sysc)
    return [[d] for d in sysc.device_map[role]]


def bundle_devices(recipe: Recipe, roles: list[str]) -> list[tuple[int, ...]]:
    """The placement group's bundles, as the devices each holds: one per device index the roles hold, except that a
    rollout replica spanning several devices (tensor parallel) takes one bundle of all of them, since one Ray actor
    must hold its GPUs. Such a replica's devices are the rollout's own (preflight refuses sharing them)."""
    multi = [tuple(s) for s in role_slots(recipe, "rollout") if len(s) > 1] if "rollout" in roles else []
    taken = {d for s in multi for d in s}
    singles = sorted({d for r in roles for s in role_slots(recipe, r) for d in s} - taken)
    return [(d,) for d in singles] + multi


def placement(recipe: Recipe, roles: list[str], *, gpu: bool,
              timeout_s: float) -> tuple[PlacementGroup, dict[tuple[int, ...], int]]:
    """One bundle per :func:`bundle_devices` entry; returns the group and its devices → bundle index."""
    held = bundle_devices(recipe, roles)
    bundles = [{"CPU": 1.0, "GPU": float(len(d))} if gpu else {"CPU": 1.0} for d in held]
    sysc = recipe.system
    if sysc.nnodes > 1:  # each bundle on the node that holds its devices (a Ray node with resource nodeN)
        nodes = node_of(sysc)
        for bundle, d in zip(bundles, held):
            bundle[NODE_RESOURCE.format(nodes[d[0]])] = 1.0
    pg = placement_group(bundles, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"Ray could not place {len(bundles)} bundles {bundles} within {timeout_s:g} s "
            f"(system.device_map holds {sum(map(len, held))} devices); the cluster has {ray.cluster_resources()}"
        ) from None
    return pg, {d: b for b, d in enumerate(held)}


def start_groups(recipe: Recipe, roles: list[str], *, gpu: bool, timeout_s: float,
                 remote: bool = False) -> dict[str, WorkerGroup]:
    """Create, place and set up one worker group per role; every rank of every group builds at once.

    ``remote``: the cluster is not this machine, so workers get tunekit shipped with them.
    """
    pg, bundle_of = placement(recipe, roles, gpu=gpu, timeout_s=timeout_s)
    slots = {role: role_slots(recipe, role) for role in roles}
    sharing = Counter(d for r in roles for s in slots[r] for d in s)
    # the launcher's thread budget per rank (OMP_NUM_THREADS), else the cores split over the device slots
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, (os.cpu_count() or 1) // len(sharing))
    options: dict[str, Any] = {}
    if remote:  # workers on other machines import tunekit (and its embedded assets) from a shipped copy
        options["runtime_env"] = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
    nodes = node_of(recipe.system) if recipe.system.nnodes > 1 else {}
    cls = ray.remote(RoleWorker)
    raw = recipe.model_dump(mode="json")
    groups = {}
    for role in roles:
        workers = []
        for rank, held in enumerate(slots[role]):
            bundle = tuple(held) if len(held) > 1 else (held[0],)
            # a worker of several devices holds its bundle whole; one device's share is 1/k of it
            share = float(len(held)) if len(held) > 1 else round(1.0 / sharing[held[0]], 4)
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle_of[bundle])
            w = cls.options(num_cpus=min(share, 1.0), num_gpus=share if gpu else 0, scheduling_strategy=strategy,
                            **options).remote(raw, role, rank=rank, world=len(slots[role]), device_index=held[0],
                                              threads=threads, node=nodes.get(held[0], 0))
            workers.append(w)
        groups[role] = WorkerGroup(role, workers, [s[0] for s in slots[role]])
    setups = {}
    for role, g in groups.items():
        addr, port = ray.get(g.workers[0].address.remote())
        setups[role] = [w.setup.remote(addr, port) for w in g.workers]
    for role, refs in setups.items():
        groups[role].info = ray.get(refs)
    return groups


def link_collective_sync(actor: WorkerGroup, rollout: WorkerGroup) -> None:
    """Form the sync group (actor rank 0, then the rollout replicas) and switch both groups to it."""
    host, port = ray.get(actor.workers[0].address.remote())
    world = 1 + rollout.world
    members = [actor.workers[0]] + rollout.workers
    ray.get([w.join_sync_group.remote(host, port, rank, world) for rank, w in enumerate(members)])
    actor.sync_manifest = ray.get(actor.workers[0].weights_manifest.remote())


def mean_metrics(per_replica: list[dict[str, float]]) -> dict[str, float]:
    """The replicas' engine metrics averaged per key (per GPU, as the spmd ranks' are); keys every replica has."""
    keys = set.intersection(*(set(m) for m in per_replica)) if per_replica else set()
    return {k: sum(m[k] for m in per_replica) / len(per_replica) for k in sorted(keys)}
