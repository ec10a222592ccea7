"""Binding a chosen option class to concrete GPUs: which node, which GPUs, which MIG slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from scheduler.core._classes import class_cand_nodes, class_cands, shared_gpus
from scheduler.core.gang import GangPlan, rank_layout
from scheduler.core.mig import popcount15
from scheduler.core.pool import KIND_SHARED, KIND_WHOLE, Pool
from scheduler.core.state import PoolState

__all__ = ["Binding", "Select", "bind", "bind_gang", "shared_gpu"]


Select = Literal["pack", "first"]


@dataclass(slots=True)
class Binding:
    """Where a chosen option lands: GPUs, node, MIG start, and the slot's free MiB before."""

    gpus: tuple[int, ...]
    node: str
    mig_start: int | None
    free_before_mib: int
    #: Nodes the GPUs span (a multi-node gang: node 0 first, GPUs in rank order).
    n_nodes: int = 1


def shared_gpu(
    pool: Pool,
    state: PoolState,
    t: int,
    need: int,
    select: Select,
    nodes_ok: np.ndarray | None = None,
) -> int:
    """The shared GPU of type ``t`` with ``need`` MiB free: the fullest ("pack") or the first,
    on a node in ``nodes_ok`` (None: any node). Without ``nodes_ok`` the answer is kept for
    the state version (bestfit's leftover asks it, then the binding of the winner)."""
    idx, free, open_, node = _shared_of_type(pool, state, t)
    cache = state.summary().fit_cache if nodes_ok is None else None
    key = ("shared_gpu", t, need, select)
    if cache is not None:
        got = cache.get(key)
        if got is not None:
            return got  # type: ignore[no-any-return]
    ok = open_ & (free >= need)
    if nodes_ok is not None:
        ok &= nodes_ok[node]
    cand = ok.nonzero()[0]
    k = int(cand[free[cand].argmin()]) if select == "pack" else int(cand[0])
    g = int(idx[k])
    if cache is not None:
        cache[key] = g
    return g


def _shared_of_type(
    pool: Pool, state: PoolState, t: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shared GPUs of type ``t`` (index order): their indices, free MiB, whether they take
    another job, and their nodes; once per state version (bestfit ranks every shared class of
    a job, and the winner is bound on the same state)."""
    now = state.summary()
    key = ("shared", t)
    got = now.fit_cache.get(key)
    if got is None:
        by_type = pool._empty.get("shared_gpus_by_type")
        if by_type is None:
            all_shared = shared_gpus(pool)
            types = {int(u) for u in pool.gpu_type[all_shared]}
            by_type = {u: all_shared[pool.gpu_type[all_shared] == u] for u in types}
            pool._empty["shared_gpus_by_type"] = by_type
        idx = by_type.get(t, np.zeros(0, np.int64))
        free = pool.capacity_mib[idx] - state.used_mib[idx]
        got = (idx, free, state.shared_count[idx] < pool.max_shared[idx], pool.gpu_node[idx])
        now.fit_cache[key] = got
    return got  # type: ignore[no-any-return]


def bind(
    pool: Pool,
    state: PoolState,
    c: int,
    n: int,
    res_mib: int,
    select: Select,
    nodes_ok: np.ndarray | None = None,
) -> Binding:
    """Concrete GPUs for class ``c`` chosen by ``select`` ("pack": fullest that fits), on a
    node in ``nodes_ok`` (where the job's CPUs and host memory fit; None: any node)."""
    kind = int(pool.class_kind[c])
    t = int(pool.class_type[c])
    if kind == KIND_WHOLE:
        s = state.summary()
        ok = _whole_nodes_of_type(pool, t) & (s.node_free >= n)
        if nodes_ok is not None:
            ok &= nodes_ok
        nodes = ok.nonzero()[0]
        k = int(nodes[s.node_free[nodes].argmin()]) if select == "pack" else int(nodes[0])
        a = int(pool.node_first[k])
        b = a + int(pool.node_count[k])
        idle = (~state.busy[a:b] & (state.used_mib[a:b] == 0)).nonzero()[0][:n] + a
        gpus = tuple(int(g) for g in idle)
        return Binding(gpus, pool.nodes[k].name, None, int(pool.class_capacity_mib[c]))
    if kind == KIND_SHARED:
        g = shared_gpu(pool, state, t, res_mib, select, nodes_ok)
        free = int(pool.capacity_mib[g] - state.used_mib[g])
        return Binding((g,), pool.nodes[int(pool.gpu_node[g])].name, None, free)
    cands = class_cands(pool)[c]
    avail = state.summary().mig_avail[cands]
    if nodes_ok is not None:
        avail &= nodes_ok[class_cand_nodes(pool)[c]]
    cands = cands[avail]
    gpu = pool.cand_gpu[cands]
    if select == "pack":
        # Fullest GPU first (keeps empty GPUs whole for big slices), then the slot order.
        key = np.lexsort((pool.cand_order[cands], gpu, -popcount15(state.mig_occ[gpu])))
    else:
        key = np.lexsort((pool.cand_order[cands], gpu))
    k = int(cands[key[0]])
    g = int(pool.cand_gpu[k])
    node = pool.nodes[int(pool.gpu_node[g])].name
    return Binding((g,), node, int(pool.cand_start[k]), int(pool.class_capacity_mib[c]))


def _whole_nodes_of_type(pool: Pool, t: int) -> np.ndarray:
    """Per node, whether it serves whole GPUs of type ``t`` (cached per pool)."""
    cache: dict[int, np.ndarray] = pool._empty.setdefault("whole_nodes_of_type", {})
    got = cache.get(t)
    if got is None:
        got = cache[t] = (pool.node_type == t) & pool.node_whole
    return got


def bind_gang(pool: Pool, state: PoolState, plan: GangPlan, capacity_mib: int) -> Binding:
    """Concrete GPUs of a multi-node gang: each planned node's first idle GPUs, node 0 (the
    rendezvous master) first."""
    idle: list[list[int]] = []
    for k in plan.nodes:
        a = int(pool.node_first[k])
        b = a + int(pool.node_count[k])
        free = np.flatnonzero(~state.busy[a:b] & (state.used_mib[a:b] == 0)) + a
        idle.append(free.tolist())
    gpus = rank_layout(pool, plan, idle)
    return Binding(gpus, pool.nodes[plan.nodes[0]].name, None, capacity_mib, len(plan.nodes))
