"""Node liveness and operator state: which nodes take new placements, and why not.

A node's worker writes ``heartbeat_at`` into ``P:node:{name}`` every few seconds. A node whose
heartbeat is older than ``stale_s`` is **down**: it gets no new placements, and jobs placed
there that no worker has started move elsewhere without using up a retry (its running jobs are
reclaimed by their own leases).
A node no worker ever registered is **unknown** and still placeable: the placement lease
(``placement_lease_s``) covers it, and a scheduler started before its workers places at once.

Operators take a node out of service with ``snugfit node cordon|drain NAME`` (``P:node_admin``):

- **cordoned**: no new placements; what is placed or running there stays (Kubernetes'
  ``kubectl cordon``).
- **draining**: no new placements, and jobs placed there but not started move elsewhere;
  running jobs finish (Slurm's DRAIN). Shown as **drained** once nothing is left on it.

``uncordon`` returns the node to service.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_NODE_STALE_S",
    "NodeAdmin",
    "NodeStatus",
    "node_statuses",
]

#: A worker beats every 5 s; three missed beats make its node down.
DEFAULT_NODE_STALE_S = 15.0


class NodeAdmin(StrEnum):
    CORDONED = "cordoned"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as placement sees it."""

    name: str
    liveness: str  # "up" | "down" | "unknown" (no worker ever registered)
    heartbeat_age_s: float | None
    admin: str | None  # a NodeAdmin value, or None
    reason: str  # why it takes no new placements ("" when it does)

    @property
    def schedulable(self) -> bool:
        return self.liveness != "down" and self.admin is None

    @property
    def evacuate(self) -> bool:
        """Jobs placed here but not started should move elsewhere."""
        return self.liveness == "down" or self.admin == NodeAdmin.DRAINING


def _float(v: str | None) -> float:
    try:
        return float(v) if v is not None else math.nan
    except ValueError:
        return math.nan


def node_statuses(
    names: list[str] | tuple[str, ...],
    registered: Mapping[str, Mapping[str, str]],
    admin: Mapping[str, str],
    *,
    now: float,
    stale_s: float | None = DEFAULT_NODE_STALE_S,
) -> dict[str, NodeStatus]:
    """The status of every pool node ``names`` from the worker records and operator states.

    ``stale_s=None`` turns liveness off (every node counts as up; operator states still apply).
    """
    out: dict[str, NodeStatus] = {}
    for name in names:
        info = registered.get(name)
        a = admin.get(name)
        a = a if a in (NodeAdmin.CORDONED, NodeAdmin.DRAINING) else None
        age: float | None = None
        if not info:
            liveness = "unknown"
            why = ""
        else:
            hb = _float(info.get("heartbeat_at"))
            age = now - hb if math.isfinite(hb) else None
            if stale_s is None:
                liveness, why = "up", ""
            elif age is None or age > stale_s:
                seen = "never" if age is None else f"{age:.0f} s ago"
                liveness = "down"
                why = (
                    f"node {name}: worker heartbeat {seen} (stale after {stale_s:g} s; is "
                    f"`snugfit worker --node {name}` running?)"
                )
            else:
                liveness, why = "up", ""
        if a is not None and not why:
            why = f"node {name} is {a} (`snugfit node uncordon {name}` returns it)"
        out[name] = NodeStatus(name, liveness, age, a, why)
    return out
