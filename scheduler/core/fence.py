"""A tick in which some GPUs take nothing new: the GPUs of nodes that are down or cordoned.

The policy runs on :meth:`PoolState.fenced` (those GPUs look full), so every policy skips them
without knowing why; what it placed is then replayed on the real state. Jobs already on the
fenced GPUs keep their capacity until they end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from scheduler.core.decision import Decision

if TYPE_CHECKING:
    from scheduler.core.loop import SchedulerCore
    from scheduler.core.pool import Pool

__all__ = ["node_gpus", "tick_fenced"]


def node_gpus(pool: Pool, names: Iterable[str]) -> np.ndarray:
    """Pool GPU indices of the named nodes (names not in the pool are ignored)."""
    wanted = set(names)
    parts = [np.arange(n.first_gpu, n.first_gpu + n.count) for n in pool.nodes if n.name in wanted]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def tick_fenced(core: SchedulerCore, gpus: np.ndarray, now_s: float) -> list[Decision]:
    """``core.tick(now_s)`` with ``gpus`` closed to new placements."""
    if gpus.size == 0:
        return core.tick(now_s)
    base = core.state
    core.state = base.fenced(gpus.tolist())
    try:
        decisions = core.tick(now_s)
    finally:
        shadow, core.state = core.state, base
        # Only additions happen inside a tick; the fenced copy is a stricter view of the same
        # state, so each of them fits on the real one.
        for jid, opt in shadow.allocations().items():
            if jid not in base:
                base.allocate(opt, jid)
    return decisions
