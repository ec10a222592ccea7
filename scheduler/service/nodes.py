"""Node liveness and operator state: which nodes take new placements, and why not.

A node's worker writes ``heartbeat_at`` into ``P:node:{name}`` every few seconds. A node whose
heartbeat is older than ``stale_s`` is **down**: it gets no new placements, and jobs placed
there that no worker has started move elsewhere without using up a retry (its running jobs are
reclaimed by their own leases). A multi-node gang with a rank there is requeued at once
(:func:`requeue_dead_gangs`): its other ranks' workers keep renewing the job's one lease, so it
would otherwise run on, waiting at a collective, until a timeout or ``time_limit_s``.
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

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler.core.fence import node_gpus
from scheduler.core.pool import Pool
from scheduler.service.events import event
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import current_placements

__all__ = [
    "DEFAULT_NODE_STALE_S",
    "NodeAdmin",
    "NodeStatus",
    "NodeWatch",
    "move_off",
    "node_statuses",
    "requeue_dead_gangs",
]

log = logging.getLogger("snugfit.scheduler")

#: While a node stays down or draining, its placed jobs are swept again this often (a standby
#: that led before may have placed there).
_RESWEEP_S = 5.0

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
    # What the node's worker found wrong with it (a static MIG layout that does not match the
    # GPU, MIG mode off, no MPS daemon): it runs nothing until the worker clears it.
    refuse: str = ""

    @property
    def schedulable(self) -> bool:
        return self.liveness != "down" and self.admin is None and not self.refuse

    @property
    def evacuate(self) -> bool:
        """Jobs placed here but not started should move elsewhere."""
        return self.liveness == "down" or self.admin == NodeAdmin.DRAINING or bool(self.refuse)


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
        refuse = str((info or {}).get("refuse") or "")
        if refuse and not why:
            why = f"node {name} refuses work: {refuse}"
        if a is not None and not why:
            why = f"node {name} is {a} (`snugfit node uncordon {name}` returns it)"
        out[name] = NodeStatus(name, liveness, age, a, why, refuse)
    return out


class NodeWatch:
    """The leader's view of its nodes: worker records re-read every ``check_s``, staleness
    judged at every :meth:`check` from them.

    Which nodes are closed or leaving changes only when the records are re-read or when an
    up node's heartbeat passes ``stale_s``; between those moments :meth:`check` reuses the
    last judgement (on a 1,000-node pool judging every node was milliseconds per step), and
    :attr:`statuses` is rebuilt for the latest ``now`` when read.
    """

    def __init__(
        self,
        store: Store,
        pool: Pool,
        *,
        stale_s: float | None = DEFAULT_NODE_STALE_S,
        check_s: float = 1.0,
    ) -> None:
        self.store = store
        self.pool = pool
        self.stale_s = None if stale_s is None else float(stale_s)
        self.check_s = float(check_s)
        self.closed: frozenset[str] = frozenset()
        self.fence = node_gpus(pool, ())
        self._records: tuple[dict[str, dict[str, str]], dict[str, str]] = ({}, {})
        self._read_at = -math.inf
        self._swept_at: dict[str, float] = {}
        self._names = [n.name for n in pool.nodes]
        self._statuses: dict[str, NodeStatus] = {}
        self._statuses_at: float | None = None
        self._now = -math.inf
        self._judged = False
        self._next_change = math.inf
        self._leaving: set[str] = set()

    @property
    def statuses(self) -> dict[str, NodeStatus]:
        """Every pool node's status as of the last :meth:`check`."""
        if self._statuses_at != self._now:
            registered, admin = self._records
            self._statuses = node_statuses(
                self._names, registered, admin, now=self._now, stale_s=self.stale_s
            )
            self._statuses_at = self._now
        return self._statuses

    def check(self, now: float) -> set[str]:
        """Refresh :attr:`statuses`, :attr:`closed` and :attr:`fence` (the GPUs of nodes that
        take nothing new); returns the down / draining nodes whose placed jobs to move now."""
        self._now = now
        if now - self._read_at >= self.check_s:
            self._read_at = now
            records = (self.store.nodes(), self.store.node_admin())
            if records != self._records:
                self._records = records
                self._judged = False
        if not self._judged or now > self._next_change:
            self._judge()
        leaving = self._leaving
        for n in list(self._swept_at):
            if n not in leaving:
                del self._swept_at[n]
        due = {n for n in leaving if now - self._swept_at.get(n, -math.inf) >= _RESWEEP_S}
        for n in due:
            self._swept_at[n] = now
        return due

    def _judge(self) -> None:
        """Closed and leaving nodes from the records at ``self._now``, and the moment the
        next up node goes stale (when that judgement can next change)."""
        statuses = self.statuses
        closed = frozenset(n for n, st in statuses.items() if not st.schedulable)
        if closed != self.closed:
            for n in sorted(closed - self.closed):
                log.warning("no new placements on %s", statuses[n].reason)
            for n in sorted(self.closed - closed):
                log.info("node %s takes placements again", n)
            self.closed = closed
            self.fence = node_gpus(self.pool, closed)
        self._leaving = {n for n, st in statuses.items() if st.evacuate}
        self._next_change = math.inf
        if self.stale_s is not None:
            for st in statuses.values():
                if st.liveness == "up" and st.heartbeat_age_s is not None:
                    # Down once its age exceeds stale_s, i.e. at any now past this moment
                    # (judged a microsecond early, so rounding never judges it late).
                    due = self._now - st.heartbeat_age_s + self.stale_s - 1e-6
                    self._next_change = min(self._next_change, due)
        self._judged = True


def move_off(
    store: Store, nodes: set[str], statuses: Mapping[str, NodeStatus], policy: str
) -> tuple[list[str], list[dict[str, Any]]]:
    """Requeue placed, unstarted jobs on ``nodes``, counted as ``moved`` (not a retry):
    (the jobs moved, their events)."""
    ids = store.job_ids("placed")
    if not ids:
        return [], []
    moved: list[str] = []
    events: list[dict[str, Any]] = []
    for jid, p in current_placements(store, ids):
        if p.node not in nodes:
            continue
        reason = f"moved before it started: {statuses[p.node].reason}"
        got = store.requeue(jid, p.attempt, reason=reason, counter="moved", from_states="placed")
        if got in _REQUEUE_ENDS:
            moved.append(jid)
            why = f"{reason}; job {got} (no retry used)"
            events.append(_requeue_event(got, jid, p.attempt, p.node, why, policy))
    if moved:
        log.warning("moved %d unstarted jobs off %s", len(moved), ", ".join(sorted(nodes)))
    return moved, events


def requeue_dead_gangs(
    store: Store, nodes: set[str], statuses: Mapping[str, NodeStatus], policy: str
) -> tuple[list[str], list[dict[str, Any]]]:
    """Requeue running multi-node gangs with a rank on a down node in ``nodes``, as a failed
    rank would (counted against ``max_retries``): the other ranks' next heartbeat answers
    "lost" and their workers stop them. (The gangs requeued, their events.)"""
    down = {n for n in nodes if statuses[n].liveness == "down"}
    if not down:
        return [], []
    ids = store.job_ids("running")
    out: list[str] = []
    events: list[dict[str, Any]] = []
    for jid, p in current_placements(store, ids):
        dead = [r for r in p.gang or () if r.node in down]
        if not dead:
            continue
        r = dead[0]
        reason = (
            f"gang rank {r.node_rank} of {len(p.gang or ())} on {r.node} lost: "
            f"{statuses[r.node].reason}; every rank stopped, gang requeued"
        )
        got = store.requeue(jid, p.attempt, reason=reason, counter="gang")
        if got not in _REQUEUE_ENDS:
            continue
        out.append(jid)
        why = reason if got == "requeued" else f"{reason}: {got}"
        events.append(_requeue_event(got, jid, p.attempt, r.node, why, policy))
    if out:
        log.warning("requeued %d gangs with a rank on %s", len(out), ", ".join(sorted(down)))
    return out, events


#: What ``Store.requeue`` answers when it moved the job (requeued, or ended it: no retry left).
_REQUEUE_ENDS = ("requeued", "failed", "cancelled")


def _requeue_event(
    got: str, job_id: str, attempt: int, node: str, reason: str, policy: str
) -> dict[str, Any]:
    """The placement-log event of a leader-side requeue that ``Store.requeue`` answered ``got``."""
    kind = "requeued" if got == "requeued" else "finished"
    return event(kind, job_id, attempt=attempt, node=node, reason=reason, policy=policy)
