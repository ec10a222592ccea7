"""The per-node host (CPU, host memory) and node-selector checks of option enumeration
(:class:`~scheduler.core.options.OptionBatch`): which (job, class) pairs need a node-by-node
look, whether they fit some node of an empty pool, and, against a state, which classes fit on
GPUs but on no node with the job's CPUs and memory free (or none its selector accepts)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from scheduler.core._classes import class_cand_nodes, class_cands
from scheduler.core.host import (
    HostAsk,
    class_nodes,
    demand,
    fit_nodes,
    fits_over_nodes,
    gpu_nodes_empty,
    within_share,
)
from scheduler.core.pool import KIND_MIG, KIND_SHARED, KIND_WHOLE, Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.selector import SelectorMasks
from scheduler.core.state import Summary

__all__ = ["asks", "host_masks", "host_refine", "no_short", "over_free_supply"]


def asks(requests: Sequence[PlacementRequest]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job: asked millicores and MiB (``SHARE``: the node's share) and the host floor MiB."""
    if not requests:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    a = np.array([r.host_ask for r in requests], np.int64)
    return a[:, 0], a[:, 1], a[:, 2]


def host_masks(
    pool: Pool,
    n: np.ndarray,
    need: np.ndarray,
    cpu: np.ndarray,
    host: np.ndarray,
    floor: np.ndarray,
    gpu_empty: np.ndarray,
    sel: SelectorMasks,
) -> tuple[np.ndarray, np.ndarray]:
    """(jobs, classes): whether a class needs the per-node check for the job (it asks for
    more than its share somewhere, or its node selector excludes some node of the class), and
    whether it fits some (matching) node's CPUs and memory at all."""
    n_jobs, k = gpu_empty.shape
    if not n_jobs or not k:
        return np.zeros((n_jobs, k), bool), np.ones((n_jobs, k), bool)
    eff_host = np.where(host >= 0, host, floor)
    # Only classes whose GPUs could hold the job matter (the others never fit).
    check = ~within_share(pool, n, need, cpu, eff_host) & gpu_empty
    if sel.any_selector:
        check |= sel.partial & gpu_empty
    if not check.any():
        # The common case (every job within its share): read-only views, no per-node work.
        return np.broadcast_to(False, (n_jobs, k)), np.broadcast_to(True, (n_jobs, k))
    empty = np.ones((n_jobs, k), bool)
    for i, c in zip(*np.nonzero(check), strict=True):
        ask = HostAsk(int(cpu[i]), int(host[i]), int(floor[i]))
        d_cpu, d_host = demand(pool, int(c), int(n[i]), ask, int(need[i, c]))
        nodes = gpu_nodes_empty(pool, int(c), int(n[i]))
        if sel.nodes[i] is not None:
            nodes = nodes & sel.nodes[i]
        empty[i, c] = bool(
            (nodes & (d_cpu <= pool.node_cpu_milli) & (d_host <= pool.node_host_mib)).any()
        )
    return check, empty


def host_refine(
    pool: Pool,
    now: Summary,
    fits_now: np.ndarray,
    exact: np.ndarray,
    need: np.ndarray,
    ask: HostAsk,
    request: PlacementRequest,
    node_ok: np.ndarray | None = None,
) -> np.ndarray:
    """Per class, whether it fits now on GPUs but no node (in ``node_ok``, the job's node
    selector; None: any) has the job's CPUs and memory free. Only classes that ask more than
    their share, sit on tight nodes, or that the selector narrows, are checked."""
    refine = fits_now & (exact | now.class_tight)
    if not np.count_nonzero(refine):
        return no_short(pool)
    short = np.zeros(fits_now.shape[0], bool)
    safe = over_free_supply(pool, now)
    kind = pool.class_kind
    n = request.n_gpus
    for c in refine.nonzero()[0].tolist():
        if not exact[c] and now.over_nodes is not None:
            # Within its share, the job fits every node whose jobs are all within theirs
            # (the rule that lets untight classes skip this check): such a node whose GPUs
            # fit settles it; only the over-share nodes need their CPUs and memory read.
            k = int(kind[c])
            ask_gpu = n if k == KIND_WHOLE else (int(need[c]) if k == KIND_SHARED else 1)
            if safe(c) >= ask_gpu:
                continue
            if node_ok is None:
                # No node without an over-share job fits its GPUs: only those nodes can.
                over = fits_over_nodes(pool, now, c, n, int(need[c]), ask)
                if over is not None:
                    short[c] = not over
                    continue
        fit = fit_nodes(pool, now, c, n, int(need[c]), ask)
        if not (fit.any() if node_ok is None else (fit & node_ok).any()):
            short[c] = True
    return short


def over_free_supply(pool: Pool, now: Summary) -> Callable[[int], int]:
    """Per class, what its nodes without an over-share job supply now (the class-supply
    figure of :class:`~scheduler.core.state.Summary` over those nodes only; -1: none), as a
    function computed once per class and summary."""
    cache = now.fit_cache

    def supply(c: int) -> int:
        key = ("over_free", c)
        got = cache.get(key)
        if got is None:
            got = _over_free(pool, now, c)
            cache[key] = got
        return int(got)

    return supply


def _over_free(pool: Pool, now: Summary, c: int) -> int:
    over = now.over_nodes
    assert over is not None
    kind = int(pool.class_kind[c])
    if kind == KIND_MIG:
        cands = class_cands(pool)[c]
        ok = now.mig_avail[cands] & ~over[class_cand_nodes(pool)[c]]
        return int(np.count_nonzero(ok))
    # Per node, the figure with -1 on over-share nodes (every figure is >= -1), once per
    # summary and kind: the most over a class's nodes is then its non-over nodes' most.
    key = ("over_masked", kind)
    masked = now.fit_cache.get(key)
    if masked is None:
        per_node = now.node_free if kind == KIND_WHOLE else now.shared_node_free_mib
        masked = np.where(over, -1, per_node)
        now.fit_cache[key] = masked
    v = masked[_class_node_index(pool)[c]]
    return int(v.max()) if v.size else -1


def _class_node_index(pool: Pool) -> list[np.ndarray]:
    cached = pool._empty.get("class_node_index")
    if cached is None:
        cached = [np.flatnonzero(m) for m in class_nodes(pool)]
        pool._empty["class_node_index"] = cached
    return cached  # type: ignore[no-any-return]


def no_short(pool: Pool) -> np.ndarray:
    cached = pool._empty.get("no_short")
    if cached is None:
        cached = np.zeros(pool.n_classes, bool)
        cached.flags.writeable = False
        pool._empty["no_short"] = cached
    return cached  # type: ignore[no-any-return]
