"""Releasing many allocations of a :class:`~scheduler.core.state.PoolState` at once.

Backfill's search (:func:`scheduler.core.backfill.earliest_fit`) releases thousands of running
jobs from copies of a saturated state. One job at a time, each release is a handful of numpy
calls; here the same subtractions and masks are applied for all of them in one go. Integer
sums and AND-NOT masks do not depend on order, and the bookkeeping (version, dirty parts,
touched nodes) is advanced exactly as that many :meth:`PoolState.release` calls would, so the
state ends bit for bit where releasing the jobs one by one, in order, leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.pool import MODE_MIG, MODE_WHOLE

if TYPE_CHECKING:
    from scheduler.core.state import PoolState

__all__ = ["release_many"]


def release_many(state: PoolState, job_ids: Sequence[str]) -> None:
    """``for j in job_ids: state.release(j)``, in one pass (the same errors: a job that holds
    nothing is refused by the one-by-one path, from where it stands in the list)."""
    allocs = state._allocs
    if len(set(job_ids)) != len(job_ids) or any(j not in allocs for j in job_ids):
        for j in job_ids:
            state.release(j)
        return
    if not job_ids:
        return
    gpus: list[int] = []
    used: list[int] = []
    res: list[int] = []
    nodes: list[int] = []
    cpu: list[int] = []
    host: list[int] = []
    over: list[int] = []
    whole: list[int] = []
    mig_gpus: list[int] = []
    mig_keep: list[int] = []
    shared: list[int] = []
    touches: dict[tuple[int, int], int] = {}
    over_changed = False
    for j in job_ids:
        a = allocs.pop(j)
        g0 = a.gpus[0]
        if len(a.gpus) == 1:
            gpus.append(g0)
            used.append(a.used_mib)
            res.append(a.reserved_mib)
        else:
            gpus += a.gpus
            used += [a.used_mib] * len(a.gpus)
            res += [a.reserved_mib] * len(a.gpus)
        nodes += a.nodes
        k = len(a.nodes)
        cpu += [a.cpu_milli] * k
        host += [a.host_mib] * k
        over += [int(a.over_share)] * k
        over_changed |= a.over_share
        if a.kind == MODE_WHOLE:
            whole += a.gpus
        elif a.kind == MODE_MIG:
            mig_gpus.append(g0)
            mig_keep.append(~a.mig_mask)
        else:
            shared.append(g0)
        # The summary parts the release makes stale depend on the kind and the GPU's node.
        key = (a.kind, a.nodes[0] if k == 1 else -1 - g0)
        if key not in touches:
            touches[key] = state._touches(a.kind, g0)
    state._over_changed |= over_changed
    if state._touched is not None:
        state._touched.update(nodes)
    if state._since is not None:
        state._since.update(nodes)
    dirty = 0
    for bits in touches.values():
        dirty |= bits
    np.subtract.at(state.used_mib, gpus, np.array(used, np.int64))
    np.subtract.at(state.reserved_mib, gpus, np.array(res, np.int64))
    np.subtract.at(state.node_cpu_milli, nodes, np.array(cpu, np.int64))
    np.subtract.at(state.node_host_mib, nodes, np.array(host, np.int64))
    np.subtract.at(state.node_over, nodes, np.array(over, np.int32))
    if whole:
        state.busy[whole] = False
    if mig_gpus:
        np.bitwise_and.at(state.mig_occ, mig_gpus, np.array(mig_keep, np.int64))
    if shared:
        np.subtract.at(state.shared_count, shared, np.ones(len(shared), np.int32))
    state.version += len(job_ids)
    state._dirty |= dirty
