"""The leader's in-memory view shared by its parts: what each attribute holds is set and
explained in :class:`~scheduler.service.leader.SchedulerService`'s constructor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.core.loop import SchedulerCore
    from scheduler.core.pool import Pool
    from scheduler.policies.base import Policy
    from scheduler.service.events import EventLog
    from scheduler.service.history_feed import HistoryFeed
    from scheduler.service.nodes import NodeWatch
    from scheduler.service.retrain import Retrainer
    from scheduler.service.store.protocol import Store

__all__: list[str] = []


@dataclass
class _Known:
    attempt: int
    submitted_at: float
    engine: dict[str, str] | None = None  # a serving replica's engine values
    method: str | None = None  # set when history answered the job


class _ServiceState:
    """Attributes the leader's mixins share (assigned in ``SchedulerService.__init__``)."""

    store: Store
    pool: Pool
    policy: Policy
    token: str
    leader_election: bool
    lease_ttl_ms: int
    events: EventLog
    simulated: bool
    telemetry: Any | None
    placement_lease_s: float
    node_watch: NodeWatch
    core: SchedulerCore
    is_leader: bool
    # job -> (attempt, placed_at), in placement order.
    _placed: dict[str, tuple[int, float]]
    _placement_checked_at: float
    _recovered_at: float
    _recover_cursor: int
    _capver: int
    _known: dict[str, _Known]
    _renewed_at: float
    history: HistoryFeed
    retrainer: Retrainer | None
