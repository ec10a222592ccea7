"""The job queue as ``squeue`` shows it: one row per job with who, state, where, how long it has
run, how long it is predicted to run still, and why a pending job waits.

Rows are read from the job records (``P:job:{id}``, one pipelined HMGET per page); nothing
here writes. ``remaining_s`` is a prediction: for a placed or running job the predicted runtime
on its option minus the time it has run (never below 0); for a pending job the shortest
predicted runtime over the GPU types the predictor answered for (where it runs is not decided
yet).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from scheduler.exceptions import ServiceError
from scheduler.service.store.keys import ACTIVE_STATES, JobState
from scheduler.service.store.protocol import Store

__all__ = ["QueueRow", "queue_rows"]

_FIELDS = (
    "state",
    "user",
    "team",
    "placement",
    "request",
    "submitted_at",
    "started_at",
    "finished_at",
    "reason",
    "hold",
    "deps",
    "attempt",
    "outcome",
)
_PAGE = 2000


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One job as ``snugfit queue`` lists it (``--json`` prints these fields, typed)."""

    id: str
    user: str | None
    team: str | None
    state: str
    option: str | None  # placement label (``H100-80GB x1``, ``A100-80GB MIG 1g.10gb``)
    node: str | None
    attempt: int
    submitted_at: float | None
    started_at: float | None
    elapsed_s: float | None  # running: since start; ended: its measured runtime
    remaining_s: float | None  # predicted (see the module doc)
    held: bool
    depends_on: list[str]
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _float(v: str | None) -> float | None:
    try:
        x = float(v) if v is not None else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _json(v: str | None) -> Any:
    if v is None:
        return None
    try:
        return json.loads(v)
    except ValueError:
        return None


def _pending_reason(row: dict[str, str | None], leader_up: bool) -> str:
    if row.get("reason"):
        return str(row["reason"])
    if not leader_up:
        return "NoScheduler: no `snugfit scheduler` holds the leader lease; start one to place it"
    # No hold, no parent left, no earlier attempt's reason: it waits for the leader's pass.
    return "Resources: waiting for a slot that fits (`snugfit explain ID` shows the options)"


def _row(jid: str, r: dict[str, str | None], now: float, leader_up: bool = True) -> QueueRow:
    state = r.get("state") or "unknown"
    # A pending job's placement, if any, is an earlier attempt's: not where it will run.
    placement = _json(r.get("placement")) if state != "pending" else None
    request = _json(r.get("request"))
    outcome = _json(r.get("outcome"))
    started = _float(r.get("started_at"))
    elapsed: float | None = None
    remaining: float | None = None
    pred: float | None = None
    if isinstance(placement, dict):
        pred = _float(str(placement.get("runtime_s")))
    if state == "running" and started is not None:
        elapsed = max(0.0, now - started)
        remaining = None if pred is None else max(0.0, pred - elapsed)
    elif state == "placed":
        remaining = pred
    elif state == "pending" and isinstance(request, dict):
        times = [x for x in request.get("runtime_s") or [] if isinstance(x, int | float)]
        remaining = min(times) if times else None
    elif isinstance(outcome, dict) and isinstance(outcome.get("runtime_s"), int | float):
        elapsed = float(outcome["runtime_s"])
    deps = _json(r.get("deps"))
    return QueueRow(
        id=jid,
        user=r.get("user"),
        team=r.get("team"),
        state=state,
        option=placement.get("label") if isinstance(placement, dict) else None,
        node=placement.get("node") if isinstance(placement, dict) else None,
        attempt=int(r.get("attempt") or 0),
        submitted_at=_float(r.get("submitted_at")),
        started_at=started if state == "running" else None,
        elapsed_s=elapsed,
        remaining_s=remaining,
        held=r.get("hold") == "1",
        depends_on=[str(d) for d in deps] if isinstance(deps, list) else [],
        reason=_pending_reason(r, leader_up) if state == "pending" else r.get("reason") or None,
    )


def queue_rows(
    store: Store,
    *,
    job_ids: Sequence[str] | None = None,
    states: Iterable[str] | None = None,
    users: Iterable[str] | None = None,
    teams: Iterable[str] | None = None,
    nodes: Iterable[str] | None = None,
    now: float | None = None,
) -> list[QueueRow]:
    """Jobs matching every filter given, oldest submission first. Without ``job_ids`` or
    ``states``, the active ones (pending, placed, running), as ``squeue`` lists them."""
    known = {s.value for s in JobState}
    want_states = set(states) if states is not None else None
    for s in want_states or ():
        if s not in known:
            raise ServiceError(f"unknown job state {s!r}; use one of {', '.join(sorted(known))}")
    if job_ids:
        ids = list(dict.fromkeys(job_ids))
    else:
        ids = sorted({j for s in (want_states or ACTIVE_STATES) for j in store.job_ids(s)})
    t = time.time() if now is None else now
    u, tm, nd = (set(x) if x is not None else None for x in (users, teams, nodes))
    out: list[QueueRow] = []
    leader_up = store.leader() is not None
    for start in range(0, len(ids), _PAGE):
        page = ids[start : start + _PAGE]
        for jid, vals in zip(page, store.get_fields(page, _FIELDS), strict=True):
            rec = dict(zip(_FIELDS, vals, strict=True))
            if rec["state"] is None:
                continue  # an id given on the command line that does not exist
            row = _row(jid, rec, t, leader_up)
            if want_states is not None and row.state not in want_states:
                continue
            if (u and row.user not in u) or (tm and row.team not in tm):
                continue
            if nd and row.node not in nd:
                continue
            out.append(row)
    out.sort(key=lambda r: (r.submitted_at if r.submitted_at is not None else math.inf, r.id))
    return _with_live_parents(store, out)


def _with_live_parents(store: Store, rows: list[QueueRow]) -> list[QueueRow]:
    """A dependency reason names the parent's state when it was written; say the state now."""
    waiting = [r for r in rows if r.reason and r.reason.startswith("Dependency:") and r.depends_on]
    parents = sorted({d for r in waiting for d in r.depends_on})
    if not parents:
        return rows
    state = {p: st for p, (st,) in zip(parents, store.get_fields(parents, ["state"]), strict=True)}
    fixed: dict[str, QueueRow] = {}
    for r in waiting:
        first = next((d for d in r.depends_on if state.get(d) != "succeeded"), None)
        if first is not None:
            why = f"Dependency: waiting on job {first} ({state.get(first)}) to succeed"
            fixed[r.id] = replace(r, reason=why)
    return [fixed.get(r.id, r) for r in rows]
