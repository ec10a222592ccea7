"""Nodes whose worker refuses work: what it found wrong (a static MIG layout that does not match
the GPU, MIG mode off, no MPS daemon on a shared node) is in its node record's ``refuse`` field.

The leader fences such nodes for every tick (no new placements) and logs the reason once; the
node takes placements again as soon as its worker clears the field.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from scheduler.core.fence import node_gpus
from scheduler.core.pool import Pool
from scheduler.service.store.protocol import Store

__all__ = ["NodeRefusals"]

log = logging.getLogger("snugfit.scheduler")


class NodeRefusals:
    """The pool GPUs of refusing nodes, re-read from the node records every ``check_s``."""

    def __init__(self, store: Store, pool: Pool, check_s: float = 1.0) -> None:
        self.store = store
        self.pool = pool
        self.check_s = check_s
        self.reasons: dict[str, str] = {}
        self._read_at = -math.inf
        self._gpus = node_gpus(pool, ())

    def gpus(self, now: float) -> np.ndarray:
        if now - self._read_at < self.check_s:
            return self._gpus
        self._read_at = now
        names = {n.name for n in self.pool.nodes}
        records = self.store.nodes()
        reasons = {
            n: str(info["refuse"])
            for n, info in records.items()
            if n in names and info.get("refuse")
        }
        if reasons != self.reasons:
            for n in sorted(set(reasons) - set(self.reasons)):
                log.warning("node %s refuses work: %s", n, reasons[n])
            for n in sorted(set(self.reasons) - set(reasons)):
                log.info("node %s takes placements again", n)
            self.reasons = reasons
            self._gpus = node_gpus(self.pool, reasons)
        return self._gpus
