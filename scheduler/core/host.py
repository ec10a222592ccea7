"""The CPU and host-memory fit rule: what a job asks of its node's cores and RAM, and where
that fits.

A node has ``cpus`` (accounted in millicores) and ``host_memory_gib`` (MiB). A job either names
its own figures (``cpus``, ``host_memory_gib`` in the spec) or takes the node's **share** of the
slot it uses: per GPU ``node cpus / node GPUs`` (and the same for memory), a MIG slice
``compute_slices / 7`` of one GPU's share, a job on a shared GPU its reservation's fraction of
the GPU's memory (what it is billed for). The host
memory share is raised to the predictor's estimate where that is larger
(``PlacementRequest.host_memory_floor_gib``, :mod:`predictor.host_memory`).

Shares are floored to whole millicores / MiB, so the shares of all a node's slots never add up
to more than the node has. That gives the fast path of placement: on a node where every job
took at most its share, a slot whose GPU is free has its share of CPU and memory free too, so
only jobs that ask for more than their share, and nodes that hold such a job ("tight" nodes),
need the per-node check below. Everything is pure numpy over the pool's nodes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core._classes import class_cand_nodes, class_cands
from scheduler.core.mig import MIG_COMPUTE_SLICES
from scheduler.core.pool import (
    KIND_MIG,
    KIND_SHARED,
    KIND_WHOLE,
    MIB_PER_GIB,
    MILLI_PER_CPU,
    MODE_CODES,
    Pool,
)

if TYPE_CHECKING:
    from scheduler.core.state import Summary

__all__ = [
    "SHARE",
    "HostAsk",
    "class_nodes",
    "demand",
    "demand_at",
    "fit_nodes",
    "fits_over_nodes",
    "fmt_cpus",
    "gpu_nodes_empty",
    "gpu_nodes_now",
    "host_reason",
    "option_share",
    "slot_share",
    "unit_share_floor",
    "within_share",
]

#: An ask of ``SHARE`` takes the node's share of the slot.
SHARE = -1


class HostAsk(NamedTuple):
    """One job's host ask: millicores and MiB (``SHARE``: the node's share), and the floor the
    predictor puts under the host memory share (MiB)."""

    cpu_milli: int = SHARE
    host_mib: int = SHARE
    floor_mib: int = 0

    @classmethod
    def of(cls, cpus: float | None, host_gib: float | None, floor_gib: float) -> HostAsk:
        return cls(
            SHARE if cpus is None else math.ceil(cpus * MILLI_PER_CPU - 1e-9),
            SHARE if host_gib is None else math.ceil(host_gib * MIB_PER_GIB - 1e-9),
            max(0, math.ceil(floor_gib * MIB_PER_GIB - 1e-9)),
        )


def fmt_cpus(milli: int) -> str:
    """``24``, ``0.5``, ``13.714``: CPUs as a person writes them."""
    return f"{milli / MILLI_PER_CPU:.3f}".rstrip("0").rstrip(".")


def class_nodes(pool: Pool) -> np.ndarray:
    """(n_classes, n_nodes) bool: which nodes can host each option class."""
    cached = pool._empty.get("class_nodes")
    if cached is None:
        k = pool.n_classes
        cached = np.zeros((k, len(pool.nodes)), bool)
        mode_of_kind = {KIND_WHOLE: MODE_CODES["whole"], KIND_SHARED: MODE_CODES["shared"]}
        cands = class_cands(pool)
        for c in range(k):
            kind = int(pool.class_kind[c])
            if kind == KIND_MIG:
                cached[c, pool.gpu_node[pool.cand_gpu[cands[c]]]] = True
            elif kind == KIND_WHOLE:
                cached[c] = (pool.node_type == pool.class_type[c]) & pool.node_whole
            else:
                cached[c] = (pool.node_type == pool.class_type[c]) & (
                    pool.node_mode == mode_of_kind[kind]
                )
        pool._empty["class_nodes"] = cached
    return cached  # type: ignore[no-any-return]


def _fraction(pool: Pool, c: int, n_gpus: int, need_mib: int) -> tuple[int, np.ndarray]:
    """(numerator, per-node denominator) of class ``c``'s slot as a fraction of a node: the
    job's GPUs (whole), its slice's compute slices of 7 (MIG), its reservation of one GPU's
    memory (shared: what it is billed for, so the shares on one GPU never pass one GPU's)."""
    kind = int(pool.class_kind[c])
    count = pool.node_count
    if kind == KIND_WHOLE:
        return n_gpus, count
    if kind == KIND_MIG:
        return int(pool.class_compute_slices[c]), count * MIG_COMPUTE_SLICES
    return need_mib, count * int(pool.class_capacity_mib[c])


def slot_share(pool: Pool, c: int, n_gpus: int, need_mib: int) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the (millicores, MiB) share of class ``c``'s slot for the job (read-only
    arrays: whole-GPU and MIG shares do not depend on the job's memory and are cached)."""
    kind = int(pool.class_kind[c])
    key = None if kind == KIND_SHARED else (c, n_gpus if kind == KIND_WHOLE else 0)
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None
    if key is not None:
        cache = pool._empty.setdefault("slot_share", {})
        got = cache.get(key)
        if got is not None:
            return got
    num, den = _fraction(pool, c, n_gpus, need_mib)
    out = (pool.node_cpu_milli * num // den, pool.node_host_mib * num // den)
    if cache is not None and key is not None:
        for a in out:
            a.flags.writeable = False
        cache[key] = out
    return out


def unit_share_floor(pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the smallest (millicores, MiB) share of one unit over the nodes that host
    it: one GPU (whole and shared classes) or one slice (MIG). A job asking at most this,
    times its GPUs (whole) or its share of one GPU's memory (shared), is within its share on
    every node of the class."""
    cached = pool._empty.get("unit_share_floor")
    if cached is None:
        members = class_nodes(pool)
        cpu = np.zeros(pool.n_classes, np.int64)
        host = np.zeros(pool.n_classes, np.int64)
        for c in range(pool.n_classes):
            m = members[c]
            if not m.any():
                continue
            if int(pool.class_kind[c]) == KIND_MIG:
                s_cpu, s_host = slot_share(pool, c, 1, 0)
            else:
                s_cpu = pool.node_cpu_milli // pool.node_count
                s_host = pool.node_host_mib // pool.node_count
            cpu[c], host[c] = int(s_cpu[m].min()), int(s_host[m].min())
        cached = (cpu, host)
        pool._empty["unit_share_floor"] = cached
    return cached  # type: ignore[no-any-return]


def demand(
    pool: Pool, c: int, n_gpus: int, ask: HostAsk, need_mib: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the (millicores, MiB) the job takes there if it gets class ``c``."""
    if ask.cpu_milli >= 0 and ask.host_mib >= 0:
        # The job's own figures on every node: no share to work out (the openb pods' case).
        n = len(pool.nodes)
        return (
            np.full(n, ask.cpu_milli, pool.node_cpu_milli.dtype),
            np.full(n, ask.host_mib, pool.node_host_mib.dtype),
        )
    s_cpu, s_host = slot_share(pool, c, n_gpus, need_mib)
    cpu = s_cpu if ask.cpu_milli < 0 else np.full_like(s_cpu, ask.cpu_milli)
    if ask.host_mib < 0:
        return cpu, np.maximum(s_host, ask.floor_mib)
    return cpu, np.full_like(s_host, ask.host_mib)


def within_share(
    pool: Pool, n: np.ndarray, need_mib: np.ndarray, cpu_milli: np.ndarray, host_mib: np.ndarray
) -> np.ndarray:
    """(jobs, classes) bool: the job asks at most its share on every node of the class.

    ``need_mib`` is (jobs, classes), the reservation per GPU; ``cpu_milli`` per job
    (``SHARE``: the share); ``host_mib`` per job: its own figure, else the predictor's floor
    (a floor within the share leaves the share as the demand).
    """
    floor_cpu, floor_host = unit_share_floor(pool)
    kind = pool.class_kind[None, :]
    whole, shared = kind == KIND_WHOLE, kind == KIND_SHARED
    cap = pool.class_capacity_mib[None, :]

    def scaled(unit: np.ndarray) -> np.ndarray:
        per = np.where(whole, unit[None, :] * n[:, None], unit[None, :])
        return np.where(shared, unit[None, :] * np.minimum(need_mib, cap) // cap, per)

    ok_cpu = (cpu_milli[:, None] < 0) | (cpu_milli[:, None] <= scaled(floor_cpu))
    return ok_cpu & (host_mib[:, None] <= scaled(floor_host))


def demand_at(
    pool: Pool, c: int, n_gpus: int, ask: HostAsk, k: int, need_mib: int
) -> tuple[int, int]:
    """The (millicores, MiB) the job takes on node ``k`` if it gets class ``c`` there."""
    kind = int(pool.class_kind[c])
    slices = int(pool.class_compute_slices[c])
    s_cpu, s_host = option_share(pool, k, kind, n_gpus, slices, need_mib)
    cpu = s_cpu if ask.cpu_milli < 0 else ask.cpu_milli
    host = max(s_host, ask.floor_mib) if ask.host_mib < 0 else ask.host_mib
    return cpu, host


def gpu_nodes_empty(pool: Pool, c: int, n_gpus: int) -> np.ndarray:
    """Per node, whether class ``c`` could hold an ``n_gpus`` job there on an empty pool."""
    m = class_nodes(pool)[c]
    if int(pool.class_kind[c]) == KIND_WHOLE:
        return m & (pool.node_count >= n_gpus)
    return m


def host_reason(
    pool: Pool,
    c: int,
    cpu: np.ndarray,
    host: np.ndarray,
    cpu_free: np.ndarray,
    host_free: np.ndarray,
    nodes: np.ndarray,
    *,
    empty: bool,
) -> str:
    """Why no node among ``nodes`` has the job's CPUs and host memory free (``empty``: even on
    an empty pool). Names the node that comes closest and the resource it lacks."""
    idx = np.flatnonzero(nodes)
    if idx.size == 0:
        return ""
    # The node that comes closest: the largest shortfall ratio is the smallest.
    with np.errstate(divide="ignore", invalid="ignore"):
        r_cpu = np.where(cpu[idx] > 0, cpu_free[idx] / cpu[idx], np.inf)
        r_host = np.where(host[idx] > 0, host_free[idx] / host[idx], np.inf)
    k = int(idx[np.argmax(np.minimum(r_cpu, r_host))])
    name = pool.nodes[k].name
    t = GPU_NAMES[int(pool.class_type[c])]
    if cpu_free[k] < cpu[k]:
        need, have, what = fmt_cpus(int(cpu[k])), fmt_cpus(int(cpu_free[k])), "CPUs"
    else:
        need = f"{host[k] / MIB_PER_GIB:.1f} GiB"
        have = f"{host_free[k] / MIB_PER_GIB:.1f} GiB"
        what = "host memory"
    if empty:
        label = pool.class_label(c)
        return f"{label}: needs {need} {what}; no {t} node has that many ({name} has {have})"
    return f"needs {need} {what}, {have} free on {name}"


def gpu_nodes_now(pool: Pool, now: Summary, c: int, n_gpus: int, need_mib: int) -> np.ndarray:
    """Per node, whether class ``c``'s GPU side (idle GPUs, a free slice, a shared GPU with
    room) fits the job there now."""
    kind = int(pool.class_kind[c])
    m = class_nodes(pool)[c]
    if kind == KIND_WHOLE:
        return m & (now.node_free >= n_gpus)
    if kind == KIND_SHARED:
        return m & (now.shared_node_free_mib >= need_mib)
    out = np.zeros(len(pool.nodes), bool)
    out[class_cand_nodes(pool)[c][now.mig_avail[class_cands(pool)[c]]]] = True
    return out


def fit_nodes(
    pool: Pool, now: Summary, c: int, n_gpus: int, need_mib: int, ask: HostAsk
) -> np.ndarray:
    """Per node, whether the job fits there now on every resource for class ``c`` (read-only;
    computed once per summary and question).

    A job within its share on every node of the class (:func:`within_share`) fits the CPUs
    and memory of every node where no job took more than its share and its GPUs fit (the
    module's fast-path rule), so only the nodes holding an over-share job are read node by
    node; the answer is the same as reading all of them."""
    key = (c, n_gpus, need_mib, ask)
    got = now.fit_cache.get(key)
    if got is None:
        got = gpu_nodes_now(pool, now, c, n_gpus, need_mib)
        if _within_one(pool, c, n_gpus, need_mib, ask):
            sub = _over_index(now)
            sub = sub[got[sub]]
            if sub.size:
                cpu, host = _demand_on(pool, c, n_gpus, ask, need_mib, sub)
                got[sub] = (cpu <= now.node_cpu_free[sub]) & (host <= now.node_host_free[sub])
        else:
            cpu, host = demand(pool, c, n_gpus, ask, need_mib)
            got &= (cpu <= now.node_cpu_free) & (host <= now.node_host_free)
        got.flags.writeable = False
        now.fit_cache[key] = got
    return got


def fits_over_nodes(
    pool: Pool, now: Summary, c: int, n_gpus: int, need_mib: int, ask: HostAsk
) -> bool | None:
    """For a job within its share on every node of class ``c``: whether one of the nodes
    holding an over-share job fits it now on every resource, which is what
    ``fit_nodes(...).any()`` answers once no other node's GPUs fit (those nodes fit its CPUs and
    memory by the share rule). Reads only those nodes; None when the job is not within its
    share (then only :func:`fit_nodes` answers)."""
    key = ("over_fit", c, n_gpus, need_mib, ask)
    got = now.fit_cache.get(key)
    if got is None:
        got = _fits_over_nodes(pool, now, c, n_gpus, need_mib, ask)
        now.fit_cache[key] = got
    return None if got is _NOT_WITHIN else bool(got)


#: fits_over_nodes' cached answer for a job not within its share.
_NOT_WITHIN = object()


def _fits_over_nodes(
    pool: Pool, now: Summary, c: int, n_gpus: int, need_mib: int, ask: HostAsk
) -> object:
    if not _within_one(pool, c, n_gpus, need_mib, ask):
        return _NOT_WITHIN
    sub = _over_index(now)
    sub = sub[class_nodes(pool)[c][sub]]
    if not sub.size:
        return False
    kind = int(pool.class_kind[c])
    if kind == KIND_WHOLE:
        sub = sub[now.node_free[sub] >= n_gpus]
    elif kind == KIND_SHARED:
        sub = sub[now.shared_node_free_mib[sub] >= need_mib]
    else:
        sub = sub[gpu_nodes_now(pool, now, c, n_gpus, need_mib)[sub]]
    if not sub.size:
        return False
    cpu, host = _demand_on(pool, c, n_gpus, ask, need_mib, sub)
    fit = (cpu <= now.node_cpu_free[sub]) & (host <= now.node_host_free[sub])
    return bool(np.count_nonzero(fit))


def _over_index(now: Summary) -> np.ndarray:
    """The nodes holding a job over its share (once per summary)."""
    got = now.fit_cache.get(("over_index",))
    if got is None:
        got = np.zeros(0, np.int64) if now.over_nodes is None else now.over_nodes.nonzero()[0]
        now.fit_cache[("over_index",)] = got
    return got  # type: ignore[no-any-return]


def _within_one(pool: Pool, c: int, n_gpus: int, need_mib: int, ask: HostAsk) -> bool:
    """:func:`within_share` for one job and one class."""
    floor_cpu, floor_host = unit_share_floor(pool)
    kind = int(pool.class_kind[c])
    cap = int(pool.class_capacity_mib[c])

    def scaled(unit: int) -> int:
        if kind == KIND_SHARED:
            return unit * min(need_mib, cap) // cap
        return unit * n_gpus if kind == KIND_WHOLE else unit

    eff_host = ask.host_mib if ask.host_mib >= 0 else ask.floor_mib
    ok_cpu = ask.cpu_milli < 0 or ask.cpu_milli <= scaled(int(floor_cpu[c]))
    return ok_cpu and eff_host <= scaled(int(floor_host[c]))


def _demand_on(
    pool: Pool, c: int, n_gpus: int, ask: HostAsk, need_mib: int, sub: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`demand` on the nodes ``sub`` only."""
    if ask.cpu_milli >= 0 and ask.host_mib >= 0:
        return (
            np.full(sub.size, ask.cpu_milli, pool.node_cpu_milli.dtype),
            np.full(sub.size, ask.host_mib, pool.node_host_mib.dtype),
        )
    if int(pool.class_kind[c]) == KIND_SHARED:
        # _fraction's shared share, on ``sub`` only.
        den = pool.node_count[sub] * int(pool.class_capacity_mib[c])
        s_cpu = pool.node_cpu_milli[sub] * need_mib // den
        s_host = pool.node_host_mib[sub] * need_mib // den
    else:
        full_cpu, full_host = slot_share(pool, c, n_gpus, need_mib)
        s_cpu, s_host = full_cpu[sub], full_host[sub]
    cpu = s_cpu if ask.cpu_milli < 0 else np.full_like(s_cpu, ask.cpu_milli)
    if ask.host_mib < 0:
        return cpu, np.maximum(s_host, ask.floor_mib)
    return cpu, np.full_like(s_host, ask.host_mib)


def option_share(
    pool: Pool, k: int, kind: int, n_gpus: int, compute_slices: int, reserved_mib: int
) -> tuple[int, int]:
    """The (millicores, MiB) share of one placed slot on node ``k`` (the scalar form of
    :func:`slot_share`)."""
    count = int(pool.node_count[k])
    if kind == KIND_WHOLE:
        num, den = n_gpus, count
    elif kind == KIND_MIG:
        num, den = compute_slices, count * MIG_COMPUTE_SLICES
    else:
        gpu_cap = int(pool.capacity_mib[int(pool.node_first[k])])
        num, den = min(reserved_mib, gpu_cap), count * gpu_cap
    return int(pool.node_cpu_milli[k]) * num // den, int(pool.node_host_mib[k]) * num // den
