"""The few reads the dashboard needs beyond the :class:`~scheduler.service.store.protocol.Store`
protocol: the newest jobs, the newest events and the stream's last id.

They read the key layout of :mod:`scheduler.service.store.keys` through the store's decoded
client (``store.r``), as ``snugfit log`` does for its ``-n`` tail, and never write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from scheduler.cli.ops import parse_record

__all__ = ["job_records", "last_event_id", "newest_events", "newest_job_ids"]


def newest_job_ids(store: Any, n: int) -> list[str]:
    """The ``n`` most recently submitted job ids, newest first."""
    if n <= 0:
        return []
    return list(store.r.zrevrange(store.keys.jobs, 0, n - 1))


def last_event_id(store: Any) -> str:
    """The id of the newest placement-log entry, or ``"0"`` when the stream is empty: a
    reader that starts after it sees only what comes next."""
    tail = store.r.xrevrange(store.keys.events, count=1)
    return str(tail[0][0]) if tail else "0"


def newest_events(store: Any, n: int) -> list[tuple[str, dict[str, Any]]]:
    """The newest ``n`` events as ``(stream id, event)``, oldest first (the order they were
    appended); an unreadable entry reads as an ``invalid`` event, as in ``Store.events``."""
    if n <= 0:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for eid, fields in reversed(store.r.xrevrange(store.keys.events, count=n)):
        try:
            event = json.loads(fields.get("e", "{}"))
        except (ValueError, TypeError):
            event = None
        if not isinstance(event, dict):
            event = {"event": "invalid", "job_id": None, "reason": "unreadable entry"}
        out.append((str(eid), event))
    return out


def job_records(store: Any, ids: Sequence[str], fields: Sequence[str]) -> list[dict[str, Any]]:
    """``fields`` of each job in ``ids`` (one pipelined read), decoded by
    :func:`scheduler.cli.ops.parse_record`; jobs that vanished meanwhile are left out."""
    out = []
    for jid, row in zip(ids, store.get_fields(list(ids), list(fields)), strict=True):
        raw = {f: v for f, v in zip(fields, row, strict=True) if v is not None}
        if not raw:
            continue
        raw.setdefault("id", jid)
        out.append(parse_record(raw))
    return out
