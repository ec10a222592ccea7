"""The queue page's data: every pending, placed and running job with its GPU option, node,
elapsed and predicted remaining time, and why a pending job waits (the Slurm-style ``Reason=``
of ``snugfit explain``); then the newest jobs of any state.

Durations are on the workload clock: ``time_scale`` real seconds per workload second (1 for a
real cluster; the demo's accelerated runs pass theirs), so a simulated job's elapsed time
compares with its predicted runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cli.ops import number
from scheduler.cli.render import option_label, pending_reason
from scheduler.core.decision import Decision
from scheduler.dashboard.pending import pending_decisions
from scheduler.dashboard.reads import job_records, newest_job_ids
from scheduler.exceptions import SchedulerError
from scheduler.service.store.keys import ACTIVE_STATES, JobState

__all__ = ["ACTIVE_ORDER", "FINISHED_SCAN", "QueueFilter", "job_row", "queue_data"]

#: The active states in the order the queue lists them (running first, as squeue does).
ACTIVE_ORDER: tuple[str, ...] = ("running", "placed", "pending")
_FIELDS = (
    "id",
    "state",
    "spec",
    "submitted_at",
    "started_at",
    "finished_at",
    "placement",
    "decision",
    "reason",
    "attempt",
    "method",
    "outcome",
    "simulated",
    "user",
    "team",
)


@dataclass(frozen=True, slots=True)
class QueueFilter:
    """Which jobs the queue lists: any of ``states`` / ``users`` / ``teams`` (empty = all).

    A finished state (``succeeded``, ``failed`` ...) is looked for among the newest
    :data:`FINISHED_SCAN` jobs; the active states are read whole (pending: its oldest
    ``limit``).
    """

    states: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()

    def match(self, row: Mapping[str, Any]) -> bool:
        return (
            (not self.states or row["state"] in self.states)
            and (not self.users or row["user"] in self.users)
            and (not self.teams or row["team"] in self.teams)
        )

    def to_dict(self) -> dict[str, list[str]]:
        return {k: sorted(getattr(self, k)) for k in ("states", "users", "teams")}


#: Newest jobs searched for a finished state the queue is filtered by.
FINISHED_SCAN = 2000


def queue_data(
    store: Any,
    *,
    now: float,
    time_scale: float = 1.0,
    limit: int = 500,
    recent: int = 50,
    where: QueueFilter | None = None,
) -> dict[str, Any]:
    """Everything the queue page shows, as plain JSON values (also ``/api/queue``)."""
    where = where or QueueFilter()
    counts = {s.value: store.count(s.value) for s in JobState}
    listed = [s for s in ACTIVE_ORDER if not where.states or s in where.states]
    finished = set(where.states) - set(ACTIVE_STATES)
    ids: list[str] = []
    for state in listed:
        if state == "pending" and counts["pending"] > limit:
            # A deep queue: only its oldest ``limit`` (P:pending is ordered by submit time),
            # so a refresh costs the same with 100,000 queued.
            ids.extend(store.pending_window(limit))
        else:
            ids.extend(store.job_ids(state))
    if finished:
        ids.extend(newest_job_ids(store, FINISHED_SCAN))
    wanted = set(listed) | finished
    recs = [r for r in job_records(store, list(dict.fromkeys(ids)), _FIELDS)]
    recs = [r for r in recs if r.get("state") in wanted]
    recs.sort(key=lambda r: (r.get("submitted_at") or math.inf, str(r.get("id"))))
    newest = job_records(store, newest_job_ids(store, recent), _FIELDS)
    # Pending jobs keep no decision in Redis: derive why they wait for those listed.
    undecided = list(
        dict.fromkeys(
            str(r["id"])
            for r in [*recs, *newest]
            if r.get("state") == "pending" and not isinstance(r.get("decision"), dict)
        )
    )
    derived = pending_decisions(store, undecided, now=now)

    def rows_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = [
            job_row(r, now=now, time_scale=time_scale, derived=derived.get(str(r["id"])))
            for r in records
        ]
        return [r for r in out if where.match(r)]

    rank = {s: k for k, s in enumerate(ACTIVE_ORDER)}
    rows = rows_of(recs)
    rows.sort(key=lambda r: (rank.get(r["state"], 9), r["submitted_at"] or math.inf, r["id"]))
    if where.users or where.teams or finished:
        more = max(len(rows) - limit, 0)  # among what was read
    else:
        more = max(sum(counts[s] for s in listed) - min(len(rows), limit), 0)
    return {
        "counts": counts,
        "jobs": rows[:limit],
        "more": more,
        "recent": rows_of(newest),
        "filter": where.to_dict(),
        "time_scale": time_scale,
    }


def job_row(
    rec: Mapping[str, Any],
    *,
    now: float,
    time_scale: float = 1.0,
    derived: Decision | None = None,
) -> dict[str, Any]:
    """One queue row from a parsed job record (:func:`scheduler.cli.ops.parse_record`);
    ``derived`` is the pending decision :mod:`.pending` worked out for a job with none stored."""
    scale = time_scale if time_scale > 0 else 1.0
    state = str(rec.get("state") or "?")
    spec: dict[str, Any] = rec["spec"] if isinstance(rec.get("spec"), dict) else {}
    place: dict[str, Any] | None = (
        rec["placement"] if isinstance(rec.get("placement"), dict) else None
    )
    outcome = rec.get("outcome") if isinstance(rec.get("outcome"), dict) else None
    submitted = number(rec.get("submitted_at"))
    started = number(rec.get("started_at"))
    finished = number(rec.get("finished_at"))
    runtime = number(place.get("runtime_s")) if place else None
    elapsed = remaining = None
    if state == "running" and started is not None:
        elapsed = max(now - started, 0.0) / scale
        if runtime is not None:
            remaining = max(runtime - elapsed, 0.0)
    elif state == "placed" and runtime is not None:
        remaining = runtime
    elif started is not None and finished is not None:
        elapsed = max(finished - started, 0.0) / scale
    end_wait = started if started is not None else (now if state in ACTIVE_STATES else finished)
    waited = (
        max(end_wait - submitted, 0.0) / scale
        if submitted is not None and end_wait is not None
        else None
    )
    model = spec.get("model")
    return {
        "id": str(rec.get("id")),
        "state": state,
        # Who ran it: the record's own fields where the client writes them, else the spec's.
        "user": rec.get("user") or spec.get("user"),
        "team": rec.get("team") or spec.get("team"),
        "model": model.get("name") if isinstance(model, dict) else model,
        "task": spec.get("task"),
        "option": option_label(place) if place else None,
        "node": place.get("node") if place else None,
        "attempt": rec.get("attempt"),
        "submitted_at": submitted,
        "waited_s": waited,
        "elapsed_s": elapsed,
        "runtime_s": runtime,
        "remaining_s": remaining,
        "cost_usd": number(place.get("cost_usd")) if place else None,
        "peak_vram_gib": number(outcome.get("peak_vram_gib")) if outcome else None,
        "reason": _reason(rec, state, derived),
        "method": rec.get("method"),
        "simulated": bool(rec.get("simulated")),
    }


def _reason(rec: Mapping[str, Any], state: str, derived: Decision | None) -> str:
    """Why a pending job waits (``Reason=...``); otherwise the record's own reason."""
    if state == "pending":
        decision = derived
        raw = rec.get("decision")
        if isinstance(raw, dict):
            try:
                decision = Decision.from_dict(raw)
            except (SchedulerError, KeyError, TypeError, ValueError):
                decision = None
        return pending_reason(decision, state)
    if state == "placed":
        return "placed; waiting for the node's worker to start it"
    return str(rec.get("reason") or "")
