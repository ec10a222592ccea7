"""Incremental parts of :meth:`PoolState.summary <scheduler.core.state.PoolState.summary>`:
the shared-GPU and MIG supply recounted on the nodes allocations touched since the last
summary, giving the same figures as the full recount over the pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.pool import Pool

if TYPE_CHECKING:
    from scheduler.core.state import PoolState, Summary

__all__ = ["cands_by_node", "mig_since", "shared_layout", "shared_since"]


#: Per node, its shared GPUs; per GPU type, the nodes with shared GPUs of that type.
_SharedLayout = tuple[dict[int, np.ndarray], dict[int, np.ndarray]]


def shared_layout(pool: Pool) -> _SharedLayout | None:
    """The shared GPUs grouped by node and the nodes by type, so a summary recounts only the
    nodes an allocation touched; None where a node's shared GPUs mix types (full recount)."""
    key = "shared_layout"
    if key not in pool._empty:
        g = pool._indices()["shared_gpus"]
        nodes = pool.gpu_node[g]
        per_node = {int(k): g[nodes == k] for k in np.unique(nodes)}
        mixed = any(len(np.unique(pool.gpu_type[v])) > 1 for v in per_node.values())
        by_type: dict[int, list[int]] = {}
        for k, v in per_node.items():
            by_type.setdefault(int(pool.gpu_type[v[0]]), []).append(k)
        type_nodes = {t: np.array(ks, np.int64) for t, ks in by_type.items()}
        pool._empty[key] = None if mixed else (per_node, type_nodes)
    return pool._empty[key]  # type: ignore[no-any-return]


def cands_by_node(pool: Pool) -> dict[int, np.ndarray]:
    """Per node, the MIG instance candidates on its GPUs."""
    cached = pool._empty.get("cands_by_node")
    if cached is None:
        nodes = pool.gpu_node[pool.cand_gpu]
        cached = {int(k): np.flatnonzero(nodes == k) for k in np.unique(nodes)}
        pool._empty["cands_by_node"] = cached
    return cached  # type: ignore[no-any-return]


def shared_since(
    state: PoolState, prev: Summary, touched: set[int], layout: _SharedLayout
) -> tuple[np.ndarray, np.ndarray]:
    """(most free MiB on an open shared GPU per type, and per node) from ``prev``, with
    the ``touched`` nodes recounted: the same figures as the full recount."""
    p = state.pool
    per_node, type_nodes = layout
    shared_free = prev.type_shared_free_mib.copy()
    shared_node = prev.shared_node_free_mib.copy()
    types: set[int] = set()
    for k in touched:
        g = per_node.get(k)
        if g is None:
            continue
        free = np.where(
            state.shared_count[g] < p.max_shared[g], p.capacity_mib[g] - state.used_mib[g], -1
        )
        shared_node[k] = max(-1, int(free.max()))
        types.add(int(p.gpu_type[g[0]]))
    for t in types:
        shared_free[t] = max(-1, int(shared_node[type_nodes[t]].max()))
    return shared_free, shared_node


def mig_since(state: PoolState, prev: Summary, touched: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """(free MIG instances, their count per class) from ``prev``, with the instances on
    the ``touched`` nodes read again: the same figures as the full recount."""
    p = state.pool
    by_node = cands_by_node(p)
    avail = prev.mig_avail.copy()
    class_avail = prev.class_avail.copy()
    for k in touched:
        idx = by_node.get(k)
        if idx is None:
            continue
        now = (state.mig_occ[p.cand_gpu[idx]] & p.cand_mask[idx]) == 0
        delta = now.astype(np.int64) - avail[idx]
        avail[idx] = now
        np.add.at(class_avail, p.cand_class[idx], delta)
    return avail, class_avail
