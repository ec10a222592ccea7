"""Why a pending job waits, when the scheduler has not stored a decision for it.

The leader stores a job's decision when it places or rejects it; a job that stays pending
keeps none in Redis (the leader re-decides it at every step, in memory). So the dashboard
enumerates and prices the job's options itself, read-only, with the same core the leader uses
(:class:`~scheduler.core.options.OptionBatch` over the published pool and the allocations in
``P:allocs``), and words the result with the same pending reason: the Slurm ``Reason=`` code
and what blocks the cheapest option ("insufficient free H100-80GB: 2 more needed"). Nodes the
leader fences (down, cordoned, draining) are not known here, so an option on one of them can
read as "fits now"; the reason then says the policy holds the job back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from scheduler.core.decide import pending_from_batch
from scheduler.core.decision import Decision, Option
from scheduler.core.options import OptionBatch
from scheduler.core.pool import Pool
from scheduler.core.state import PoolState
from scheduler.exceptions import SchedulerError
from scheduler.service._intake import InvalidRecord, decode_request

__all__ = ["DERIVED_POLICY", "current_state", "derived_pending", "pending_decisions"]

#: The ``policy`` of a decision the dashboard derived (shown on the job page).
DERIVED_POLICY = "the pool as it stands now (derived by the dashboard)"
_FIELDS = ("state", "attempt", "submitted_at", "reserved_gib", "request")


def current_state(pool: Pool, allocations: dict[str, str]) -> PoolState:
    """The pool state ``P:allocs`` describes (unreadable or clashing entries skipped)."""
    state = pool.state()
    for jid, raw in allocations.items():
        try:
            a = json.loads(raw)
            state.allocate(Option.from_dict(a.get("option") or {}), jid)
        except (ValueError, TypeError, AttributeError, SchedulerError):
            continue  # one stale or corrupt record must not hide the rest of the pool
    return state


def pending_decisions(
    store: Any, job_ids: Sequence[str], *, now: float | None = None
) -> dict[str, Decision]:
    """A pending :class:`Decision` for each of ``job_ids`` that is pending with a readable
    request, against the pool and allocations in Redis now; {} before a pool is published."""
    config = store.pool_config()
    if config is None or not job_ids:
        return {}
    try:
        pool = Pool.from_dict(config)
    except SchedulerError:
        return {}
    requests = []
    for jid, row in zip(job_ids, store.get_fields(list(job_ids), list(_FIELDS)), strict=True):
        try:
            requests.append(decode_request(pool, jid, *row))
        except InvalidRecord:
            continue
    if not requests:
        return {}
    state = current_state(pool, store.allocations())
    batch = OptionBatch(requests, pool)
    t = time.time() if now is None else now
    return {
        r.job_id: pending_from_batch(batch, i, state, policy=DERIVED_POLICY, now_s=t)
        for i, r in enumerate(requests)
    }


def derived_pending(store: Any, job_id: str, reason: str) -> Decision | None:
    """The options of one pending job the leader keeps deciding in memory, priced now; None
    for a held or dependent job (the scheduler has not seen it: its reason says what it waits
    for) or when nothing can be derived. ``explain`` and ``logs -f`` word their reason by it."""
    if reason.startswith(("JobHeldUser", "Dependency")):
        return None
    return pending_decisions(store, [job_id]).get(job_id)
