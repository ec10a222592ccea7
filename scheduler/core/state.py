"""What a pool has taken right now: per-GPU numpy arrays, and a summary per option class.

A :class:`PoolState` is plain numpy so placement can scan a 10,000-GPU pool per job in
microseconds; :meth:`PoolState.summary` is recomputed only for the kinds an allocation touched.
Memory is accounted in whole MiB (``int64``), so ``allocate`` followed by ``release`` restores
every array bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core._incremental import mig_since, shared_layout, shared_since
from scheduler.core._slot_checks import checked_gpus, slot_use
from scheduler.core.host import class_nodes, fmt_cpus, option_share
from scheduler.core.pool import (
    MIB_PER_GIB,
    MILLI_PER_CPU,
    MODE_MIG,
    MODE_SHARED,
    MODE_WHOLE,
    Pool,
    gib_to_mib_ceil,
)
from scheduler.exceptions import PlacementError, PoolError

if TYPE_CHECKING:
    from scheduler.core.decision import Option

__all__ = ["PoolState", "Summary", "TypeFree"]


# Which parts of a state summary an allocation of each kind makes stale (bit = 1 << MODE_*).
_DIRTY_WHOLE, _DIRTY_MIG, _DIRTY_SHARED = 1 << MODE_WHOLE, 1 << MODE_MIG, 1 << MODE_SHARED


_ALL_KINDS = _DIRTY_WHOLE | _DIRTY_MIG | _DIRTY_SHARED


class TypeFree(NamedTuple):
    gpus: int
    idle_gpus: int
    free_gib: float


@dataclass(frozen=True, slots=True)
class _Alloc:
    option: Option
    kind: int
    gpus: tuple[int, ...]
    used_mib: int  # memory taken from each GPU
    reserved_mib: int  # the job's reservation on each GPU
    mig_mask: int
    nodes: tuple[int, ...]  # the node, or a multi-node gang's nodes
    cpu_milli: int  # CPUs taken on each node (millicores)
    host_mib: int  # host memory taken on each node
    over_share: bool  # took more CPU or host memory than its slot's share


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-state aggregates that option enumeration reads (computed once per state version)."""

    node_free: np.ndarray  # idle GPUs per node (only read for whole-mode nodes)
    type_max_node_free: np.ndarray  # (n_types,) most idle whole GPUs in one node
    type_shared_free_mib: np.ndarray  # (n_types,) most free MiB on an open shared GPU
    class_avail: np.ndarray  # (n_classes,) MIG instances creatable now (0 for other kinds)
    mig_avail: np.ndarray  # (n_cands,) bool
    # (n_classes,) what each option class can supply now, compared against a job's demand:
    # whole -> most idle GPUs in one node, shared -> most free MiB on an open GPU, MIG -> free
    # instances. One comparison per job then answers "fits now" for every class.
    class_supply: np.ndarray
    # Host resources (scheduler.core.host): free millicores and MiB per node, the most free MiB
    # on an open shared GPU per node (-1: none), and per class whether some node of it holds a
    # job over its share (then even a share-sized job needs the per-node check).
    node_cpu_free: np.ndarray
    node_host_free: np.ndarray
    shared_node_free_mib: np.ndarray
    class_tight: np.ndarray
    any_tight: bool = False
    # Per node, whether it holds a job over its share (None: no node does).
    over_nodes: np.ndarray | None = None
    # Per-node host fits already computed against this summary (scheduler.core.host.fit_nodes,
    # keyed by class, GPUs, MiB and ask): a decision asks the same question when it checks a
    # row, ranks the options and binds the winner; the summary lives one state version.
    # Also the shared GPUs of each type with their free MiB (scheduler.core.binding).
    fit_cache: dict[tuple[Any, ...], Any] = field(default_factory=dict, compare=False, repr=False)


def _whole_nodes_by_type(pool: Pool) -> dict[int, np.ndarray]:
    """Per GPU type, its whole-serving nodes (the type's most idle whole GPUs is their max)."""
    cached = pool._empty.get("whole_nodes_by_type")
    if cached is None:
        w = np.flatnonzero(pool.node_whole)
        types = pool.node_type[w].astype(np.int64)
        cached = {int(t): w[types == t] for t in np.unique(types)}
        pool._empty["whole_nodes_by_type"] = cached
    return cached  # type: ignore[no-any-return]


#: PoolState's per-GPU and per-node arrays (copied by copy(), taken over by adopt()).
_STATE_ARRAYS = (
    "used_mib",
    "reserved_mib",
    "busy",
    "mig_occ",
    "shared_count",
    "node_cpu_milli",
    "node_host_mib",
    "node_over",
)


class PoolState:
    """What is taken on every GPU right now. Cheap to copy; ``release`` undoes ``allocate``.

    Arrays (one entry per GPU, aligned with ``pool.gpu_*``): ``used_mib`` (memory no one else
    can take: a whole GPU, MIG slices, shared reservations), ``reserved_mib`` (sum of job
    reservations), ``busy`` (a whole-GPU job holds it), ``mig_occ`` (15-bit slice mask),
    ``shared_count`` (jobs on a shared GPU). Per node: ``node_cpu_milli`` and ``node_host_mib``
    taken, and ``node_over`` (jobs holding more than their slot's share of either).
    """

    __slots__ = (
        "_allocs",
        "_dirty",
        "_over_changed",
        "_since",
        "_summary",
        "_summary_version",
        "_touched",
        "busy",
        "mig_occ",
        "node_cpu_milli",
        "node_host_mib",
        "node_over",
        "pool",
        "reserved_mib",
        "shared_count",
        "used_mib",
        "version",
    )

    def __init__(self, pool: Pool) -> None:
        n = pool.n_gpus
        self.pool = pool
        self.used_mib = np.zeros(n, np.int64)
        self.reserved_mib = np.zeros(n, np.int64)
        self.busy = np.zeros(n, bool)
        self.mig_occ = np.zeros(n, np.int64)
        self.shared_count = np.zeros(n, np.int32)
        self.node_cpu_milli = np.zeros(len(pool.nodes), np.int64)
        self.node_host_mib = np.zeros(len(pool.nodes), np.int64)
        self.node_over = np.zeros(len(pool.nodes), np.int32)
        self._allocs: dict[str, _Alloc] = {}
        self.version = 0
        self._summary: Summary | None = None
        self._summary_version = -1
        self._dirty = 0
        # Nodes allocate/release touched since the summary last counted idle GPUs per node,
        # or None (unknown: the next summary recounts every node).
        self._touched: set[int] | None = None
        # Nodes touched since the last summary (None with _touched): the shared and MIG recount.
        self._since: set[int] | None = None
        self._over_changed = True  # node_over moved since the summary was computed

    # -- views --------------------------------------------------------------------------------

    @property
    def free_mib(self) -> np.ndarray:
        return self.pool.capacity_mib - self.used_mib

    @property
    def free_gib(self) -> np.ndarray:
        """Per-GPU memory nobody holds (0 on a whole-GPU job's GPU), GiB."""
        return self.free_mib / MIB_PER_GIB

    @property
    def capacity_gib(self) -> np.ndarray:
        return self.pool.capacity_mib / MIB_PER_GIB

    @property
    def idle(self) -> np.ndarray:
        """GPUs with nothing on them."""
        return self.used_mib == 0

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(self._allocs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._allocs

    def __len__(self) -> int:
        return len(self._allocs)

    def option_of(self, job_id: str) -> Option:
        try:
            return self._allocs[job_id].option
        except KeyError:
            raise PlacementError(f"job {job_id!r} holds nothing in this pool") from None

    def allocations(self) -> dict[str, Option]:
        return {j: a.option for j, a in self._allocs.items()}

    def free_by_type(self) -> dict[str, TypeFree]:
        out: dict[str, TypeFree] = {}
        idle = self.idle
        free = self.free_mib
        for t, name in enumerate(GPU_NAMES):
            m = self.pool.gpu_type == t
            if not m.any():
                continue
            out[name] = TypeFree(
                gpus=int(m.sum()),
                idle_gpus=int((idle & m).sum()),
                free_gib=float(free[m].sum()) / MIB_PER_GIB,
            )
        return out

    def copy(self) -> PoolState:
        new = PoolState.__new__(PoolState)
        new.pool = self.pool
        for name in _STATE_ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        new._take_bookkeeping(self)
        return new

    def adopt(self, other: PoolState) -> None:
        """Become ``other``, a :meth:`copy` of this state that allocations were then made on:
        the same as making those allocations here, in the same order, without checking each
        one again (they were checked on ``other``)."""
        if other.pool is not self.pool or len(other._allocs) < len(self._allocs):
            raise PlacementError("adopt() takes a copy of this state that only added allocations")
        for name in _STATE_ARRAYS:
            np.copyto(getattr(self, name), getattr(other, name))
        self._take_bookkeeping(other)

    def _take_bookkeeping(self, other: PoolState) -> None:
        """``other``'s allocations, version and summary with its incremental-recount state
        (one list for copy and adopt: a summary taken over without the nodes touched since it
        was counted keeps their stale idle counts)."""
        self._allocs = dict(other._allocs)
        self.version = other.version
        self._summary = other._summary
        self._summary_version = other._summary_version
        self._dirty = other._dirty
        self._touched = None if other._touched is None else set(other._touched)
        self._since = None if other._since is None else set(other._since)
        self._over_changed = other._over_changed

    def fenced(
        self, gpu_indices: Iterable[int], holds: Iterable[tuple[int, int, int]] = ()
    ) -> PoolState:
        """A copy in which the given GPUs take nothing new (a backfill reservation's shadow).

        Each of ``holds`` = (node, millicores, MiB) also keeps that much of a node's CPUs and
        host memory for the reservation (one per node of a multi-node gang); the node then
        counts as holding a job over its share, so every option there gets the per-node host
        check.
        """
        new = self.copy()
        idx = np.fromiter(gpu_indices, np.int64)
        new.busy[idx] = True
        new.used_mib[idx] = self.pool.capacity_mib[idx]
        new.mig_occ[idx] = (1 << 15) - 1
        new.shared_count[idx] = np.maximum(self.pool.max_shared[idx], new.shared_count[idx])
        for k, cpu, host in holds:
            if cpu > 0 or host > 0:
                new.node_cpu_milli[k] += cpu
                new.node_host_mib[k] += host
                new.node_over[k] += 1
        new._summary = None
        new._summary_version = -1
        new._dirty = _ALL_KINDS
        new._touched = None
        new._since = None
        new._over_changed = True
        return new

    # -- aggregates for enumeration ------------------------------------------------------------

    def summary(self) -> Summary:
        if self._summary is not None and self._summary_version == self.version:
            return self._summary
        p = self.pool
        prev = self._summary
        dirty = self._dirty if prev is not None else _ALL_KINDS
        idx = p._indices()
        ct = p.class_type
        touched, since = self._touched, self._since
        if prev is not None and dirty & _DIRTY_WHOLE and touched is not None:
            # Only the nodes allocate/release touched since ``prev``'s count changed.
            node_free, tmax = self._node_free_since(prev, touched)
            self._touched = set()
        elif prev is None or dirty & _DIRTY_WHOLE:
            # Nodes are contiguous GPU ranges, so per-node sums are one reduceat.
            free_whole = (~self.busy & (self.used_mib == 0)).astype(np.int64)
            node_free = np.add.reduceat(free_whole, p.node_first) if len(p.nodes) else free_whole
            tmax = np.zeros(len(GPU_NAMES), np.int64)
            np.maximum.at(tmax, idx["whole_node_type"], node_free[idx["whole_nodes"]])
            self._touched = set()
        else:
            node_free, tmax = prev.node_free, prev.type_max_node_free
        layout = shared_layout(p) if prev is not None and touched is not None else None
        if prev is not None and dirty & _DIRTY_SHARED and layout is not None:
            assert since is not None
            shared_free, shared_node = shared_since(self, prev, since, layout)
        elif prev is None or dirty & _DIRTY_SHARED:
            g = idx["shared_gpus"]
            shared_free = np.full(len(GPU_NAMES), -1, np.int64)
            shared_node = np.full(len(p.nodes), -1, np.int64)
            if g.size:
                open_ = self.shared_count[g] < p.max_shared[g]
                free = np.where(open_, p.capacity_mib[g] - self.used_mib[g], -1)
                np.maximum.at(shared_free, idx["shared_type"], free)
                np.maximum.at(shared_node, p.gpu_node[g], free)
        else:
            shared_free = prev.type_shared_free_mib
            shared_node = prev.shared_node_free_mib
        avail, class_avail = self._mig_part(prev, dirty, since)
        supply = np.where(
            idx["class_whole"],
            tmax[ct],
            np.where(idx["class_shared"], shared_free[ct], class_avail),
        )
        # Every allocation touches its node's CPUs and memory: these are O(nodes) copies.
        cpu_free = p.node_cpu_milli - self.node_cpu_milli
        host_free = p.node_host_mib - self.node_host_mib
        any_over = bool(np.count_nonzero(self.node_over))
        if prev is not None and not self._over_changed:
            tight = prev.class_tight
        elif any_over:
            tight = np.asarray((class_nodes(p) & (self.node_over > 0)[None, :]).any(axis=1))
        else:
            tight = np.zeros(p.n_classes, bool)
        self._summary = Summary(
            node_free,
            tmax,
            shared_free,
            class_avail,
            avail,
            supply,
            cpu_free,
            host_free,
            shared_node,
            tight,
            any_over,
            (self.node_over > 0) if any_over else None,
        )
        self._summary_version = self.version
        self._dirty = 0
        self._since = None if self._touched is None else set()
        self._over_changed = False
        return self._summary

    def _mig_part(
        self, prev: Summary | None, dirty: int, since: set[int] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The summary's free MIG instances and their count per class."""
        p = self.pool
        if prev is not None and dirty & _DIRTY_MIG and since is not None:
            return mig_since(self, prev, since)
        if prev is not None and not dirty & _DIRTY_MIG:
            return prev.mig_avail, prev.class_avail
        if not p.cand_gpu.size:
            return np.zeros(0, bool), np.zeros(p.n_classes, np.int64)
        avail = (self.mig_occ[p.cand_gpu] & p.cand_mask) == 0
        return avail, np.bincount(p.cand_class[avail], minlength=p.n_classes)

    def _node_free_since(self, prev: Summary, touched: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """(idle GPUs per node, most idle whole GPUs in one node per type) from ``prev``, with
        the ``touched`` nodes recounted: the same figures as the full recount."""
        p = self.pool
        node_free = prev.node_free.copy()
        tmax = prev.type_max_node_free.copy()
        types: set[int] = set()
        for k in touched:
            a = int(p.node_first[k])
            b = a + int(p.node_count[k])
            node_free[k] = np.count_nonzero(~self.busy[a:b] & (self.used_mib[a:b] == 0))
            types.add(int(p.node_type[k]))
        by_type = _whole_nodes_by_type(p)
        for t in types:
            w = by_type.get(t)
            tmax[t] = int(node_free[w].max()) if w is not None else 0
        return node_free, tmax

    # -- mutation -----------------------------------------------------------------------------

    def allocate(self, option: Option, job_id: str) -> None:
        """Commit ``option`` for ``job_id``; PlacementError (and no change) if it is not free."""
        if job_id in self._allocs:
            raise PlacementError(f"job {job_id!r} already holds GPUs; release it first")
        gpus, idx, mode = checked_gpus(self.pool, option, job_id)
        res = gib_to_mib_ceil(option.reserved_gib)
        used, mask = slot_use(self, option, job_id, gpus, idx, mode, res)
        # GPUs first, then the node's CPUs and memory; nothing changes until both fit.
        k_node, cpu, host, over = self._host_take(option, job_id, gpus, mode, res)
        at_gpu: int | np.ndarray = gpus[0] if len(gpus) == 1 else idx  # a scalar: cheaper
        if mode == MODE_WHOLE:
            self.busy[at_gpu] = True
        elif mode == MODE_MIG:
            self.mig_occ[gpus[0]] |= mask
        else:
            self.shared_count[gpus[0]] += 1
        self.used_mib[at_gpu] += used
        self.reserved_mib[at_gpu] += res
        at: int | list[int] = k_node[0] if len(k_node) == 1 else k_node
        self.node_cpu_milli[at] += cpu
        self.node_host_mib[at] += host
        self.node_over[at] += over
        self._over_changed |= bool(over)
        self._allocs[job_id] = _Alloc(
            option, mode, gpus, used, res, mask, tuple(k_node), cpu, host, bool(over)
        )
        self.version += 1
        self._dirty |= self._touches(mode, gpus[0])
        if self._touched is not None:
            self._touched.update(k_node)
        if self._since is not None:
            self._since.update(k_node)

    def _touches(self, kind: int, gpu: int) -> int:
        """The summary parts an allocation of ``kind`` on ``gpu`` makes stale: on a shared
        node that also serves whole GPUs, whole and shared supply move together; a whole-mode
        node has no shared GPU (the shared part reads shared-mode GPUs only)."""
        k = self.pool.gpu_node[gpu]
        if kind == MODE_MIG or self.pool.node_mode[k] != MODE_SHARED:
            return 1 << kind
        return _DIRTY_SHARED | (_DIRTY_WHOLE if self.pool.node_whole[k] else 0)

    def _host_take(
        self, option: Option, job_id: str, gpus: tuple[int, ...], mode: int, res_mib: int
    ) -> tuple[list[int], int, int, int]:
        """(nodes, millicores, MiB, over-share flag) the option takes on each of its nodes;
        PlacementError when a node has too little free. Options without host figures (records
        written before CPUs were accounted) take nothing."""
        p = self.pool
        if len(gpus) == 1:
            nodes = [int(p.gpu_node[gpus[0]])]
        else:
            nodes = list(dict.fromkeys(p.gpu_node[list(gpus)].tolist()))
        if len(nodes) != option.n_nodes or len(gpus) % len(nodes):
            raise PlacementError(
                f"job {job_id!r}: GPUs {gpus} span {len(nodes)} nodes but option {option.label} "
                f"has n_nodes={option.n_nodes}; a gang takes an equal share of each of its nodes"
            )
        over = 0
        for k in nodes:
            cpu, host, o = self._host_node(
                option, job_id, k, mode, res_mib, len(gpus) // len(nodes)
            )
            over |= o
        return nodes, cpu, host, over

    def _host_node(
        self, option: Option, job_id: str, k: int, mode: int, res_mib: int, n_gpus: int
    ) -> tuple[int, int, int]:
        """(millicores, MiB, over-share flag) the option takes on node ``k``."""
        p = self.pool
        cpu = 0 if option.cpus is None else round(option.cpus * MILLI_PER_CPU)
        host = 0 if option.host_memory_gib is None else round(option.host_memory_gib * MIB_PER_GIB)
        if cpu < 0 or host < 0:
            raise PlacementError(
                f"job {job_id!r}: cpus {option.cpus!r} and host_memory_gib "
                f"{option.host_memory_gib!r} must not be negative"
            )
        name = p.nodes[k].name
        free_cpu = int(p.node_cpu_milli[k] - self.node_cpu_milli[k])
        if cpu > free_cpu:
            raise PlacementError(
                f"job {job_id!r}: needs {fmt_cpus(cpu)} CPUs, {fmt_cpus(free_cpu)} free on {name}"
            )
        free_host = int(p.node_host_mib[k] - self.node_host_mib[k])
        if host > free_host:
            raise PlacementError(
                f"job {job_id!r}: needs {host / MIB_PER_GIB:.1f} GiB host memory, "
                f"{free_host / MIB_PER_GIB:.1f} GiB free on {name}"
            )
        slices = 0
        if mode == MODE_MIG and option.mig_profile is not None:
            gt = p.catalogue[option.gpu_type]
            slices = gt.mig_profile(option.mig_profile).compute_slices
        s_cpu, s_host = option_share(p, k, mode, n_gpus, slices, res_mib)
        return cpu, host, int(cpu > s_cpu or host > s_host)

    def release(self, job_id: str) -> Option:
        """Undo ``allocate`` exactly; returns the option the job held."""
        try:
            a = self._allocs.pop(job_id)
        except KeyError:
            raise PlacementError(
                f"job {job_id!r} holds nothing in this pool; it was never placed or was "
                "already released"
            ) from None
        idx = np.array(a.gpus, np.int64)
        self.used_mib[idx] -= a.used_mib
        self.reserved_mib[idx] -= a.reserved_mib
        # One node (the common case) indexes as a scalar: cheaper than a fancy index.
        nodes: int | list[int] = a.nodes[0] if len(a.nodes) == 1 else list(a.nodes)
        self.node_cpu_milli[nodes] -= a.cpu_milli
        self.node_host_mib[nodes] -= a.host_mib
        self.node_over[nodes] -= int(a.over_share)
        self._over_changed |= a.over_share
        if a.kind == MODE_WHOLE:
            self.busy[idx] = False
        elif a.kind == MODE_MIG:
            self.mig_occ[a.gpus[0]] &= ~a.mig_mask
        else:
            self.shared_count[a.gpus[0]] -= 1
        self.version += 1
        self._dirty |= self._touches(a.kind, a.gpus[0])
        if self._touched is not None:
            self._touched.update(a.nodes)
        if self._since is not None:
            self._since.update(a.nodes)
        return a.option

    @classmethod
    def from_allocations(cls, pool: Pool, allocations: Mapping[str, Option]) -> PoolState:
        """Rebuild a state from stored placements (e.g. after a scheduler restart)."""
        state = cls(pool)
        for job_id, option in allocations.items():
            state.allocate(option, job_id)
        return state

    def assert_consistent(self) -> None:
        """Recompute everything from the allocations; PoolError on any mismatch or overcommit."""
        p = self.pool
        n = p.n_gpus
        used = np.zeros(n, np.int64)
        reserved = np.zeros(n, np.int64)
        busy = np.zeros(n, bool)
        occ = np.zeros(n, np.int64)
        count = np.zeros(n, np.int32)
        n_nodes = len(p.nodes)
        cpu = np.zeros(n_nodes, np.int64)
        host = np.zeros(n_nodes, np.int64)
        n_over = np.zeros(n_nodes, np.int32)
        problems: list[str] = []
        for job_id, a in self._allocs.items():
            cpu[list(a.nodes)] += a.cpu_milli
            host[list(a.nodes)] += a.host_mib
            n_over[list(a.nodes)] += int(a.over_share)
            for g in a.gpus:
                used[g] += a.used_mib
                reserved[g] += a.reserved_mib
                if a.kind == MODE_WHOLE:
                    if busy[g]:
                        problems.append(f"GPU {g} is held by two whole-GPU jobs (one is {job_id})")
                    busy[g] = True
                    if a.reserved_mib > p.capacity_mib[g]:
                        problems.append(f"job {job_id} reserves more than GPU {g} holds")
                elif a.kind == MODE_MIG:
                    if occ[g] & a.mig_mask:
                        problems.append(f"MIG slices overlap on GPU {g} (job {job_id})")
                    occ[g] |= a.mig_mask
                    if a.reserved_mib > a.used_mib:
                        problems.append(f"job {job_id} reserves more than its MIG slice")
                else:
                    count[g] += 1
                if gib_to_mib_ceil(a.option.reserved_gib) != a.reserved_mib:
                    problems.append(f"job {job_id}: stored reservation differs from its option")
        for name, want, have in (
            ("used_mib", used, self.used_mib),
            ("reserved_mib", reserved, self.reserved_mib),
            ("busy", busy, self.busy),
            ("mig_occ", occ, self.mig_occ),
            ("shared_count", count, self.shared_count),
            ("node_cpu_milli", cpu, self.node_cpu_milli),
            ("node_host_mib", host, self.node_host_mib),
            ("node_over", n_over, self.node_over),
        ):
            bad = np.flatnonzero(want != have)
            if bad.size:
                problems.append(f"{name} disagrees with the allocations at {bad[:8].tolist()}")
        over = np.flatnonzero(self.used_mib > p.capacity_mib)
        if over.size:
            problems.append(f"GPUs {over[:8].tolist()} are over-committed")
        if (self.reserved_mib > self.used_mib).any():
            problems.append("some GPU holds more reservations than memory taken")
        if (self.shared_count > np.maximum(p.max_shared, 0)).any():
            problems.append("some shared GPU exceeds max_shared_jobs")
        for what, taken, cap in (
            ("CPUs", self.node_cpu_milli, p.node_cpu_milli),
            ("host memory", self.node_host_mib, p.node_host_mib),
        ):
            bad = np.flatnonzero(taken > cap)
            if bad.size:
                names = [p.nodes[int(k)].name for k in bad[:8]]
                problems.append(f"nodes {names} are over-committed on {what}")
        if problems:
            raise PoolError("pool state is inconsistent: " + "; ".join(problems))
