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
from typing import Any

from scheduler.cli.render import option_label, pending_reason
from scheduler.core.decision import Decision
from scheduler.dashboard.pending import pending_decisions
from scheduler.dashboard.reads import job_records, newest_job_ids
from scheduler.exceptions import SchedulerError
from scheduler.service.store.keys import ACTIVE_STATES, JobState

__all__ = ["ACTIVE_ORDER", "job_row", "queue_data"]

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


def queue_data(
    store: Any, *, now: float, time_scale: float = 1.0, limit: int = 500, recent: int = 50
) -> dict[str, Any]:
    """Everything the queue page shows, as plain JSON values (also ``/api/queue``)."""
    counts = {s.value: store.count(s.value) for s in JobState}
    active: list[str] = []
    for state in ACTIVE_ORDER:
        if state == "pending" and counts["pending"] > limit:
            # A deep queue: only its oldest ``limit`` (P:pending is ordered by submit time),
            # so a refresh costs the same with 100,000 queued.
            active.extend(store.pending_window(limit))
        else:
            active.extend(store.job_ids(state))
    states = set(ACTIVE_STATES)
    recs = [r for r in job_records(store, active, _FIELDS) if r.get("state") in states]
    recs.sort(key=lambda r: (r.get("submitted_at") or math.inf, str(r.get("id"))))
    # Pending jobs keep no decision in Redis: derive why they wait for those listed.
    undecided = [
        str(r["id"])
        for r in recs
        if r.get("state") == "pending" and not isinstance(r.get("decision"), dict)
    ]
    derived = pending_decisions(store, undecided, now=now)
    rows = [
        job_row(r, now=now, time_scale=time_scale, derived=derived.get(str(r["id"]))) for r in recs
    ]
    rank = {s: k for k, s in enumerate(ACTIVE_ORDER)}
    rows.sort(key=lambda r: (rank.get(r["state"], 9), r["submitted_at"] or math.inf, r["id"]))
    newest = job_records(store, newest_job_ids(store, recent), _FIELDS)
    missing = [str(r["id"]) for r in newest if r.get("state") == "pending"]
    derived.update(pending_decisions(store, [j for j in missing if j not in derived], now=now))
    return {
        "counts": counts,
        "jobs": rows[:limit],
        "more": max(sum(counts[s] for s in ACTIVE_ORDER) - min(len(rows), limit), 0),
        "recent": [
            job_row(r, now=now, time_scale=time_scale, derived=derived.get(str(r["id"])))
            for r in newest
        ],
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
    submitted = _num(rec.get("submitted_at"))
    started = _num(rec.get("started_at"))
    finished = _num(rec.get("finished_at"))
    runtime = _num(place.get("runtime_s")) if place else None
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
        "cost_usd": _num(place.get("cost_usd")) if place else None,
        "peak_vram_gib": _num(outcome.get("peak_vram_gib")) if outcome else None,
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


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
