"""How one rank of a multi-node gang ends (:mod:`scheduler.core.gang`).

Each node of a gang runs its share as its own RQ job. A rank that ends well marks itself done
(``gang_done.lua``); the last one finishes the job as a single-node run would. A rank that fails
(non-zero exit, OOM, time limit) ends the whole gang: it requeues the attempt, which frees every
node's capacity at once, and the other ranks' next heartbeat answers "lost", so their workers
stop them (SIGTERM, then SIGKILL) and discard their outcome. The leader then places the gang
again, as a new attempt, after ``max_retries`` such requeues it fails. A rank that ran out of
memory is requeued by the single-node OOM rule (:func:`workers._outcome._requeue_after_oom`,
:func:`scheduler.core.escalation.escalate_oom`): the retry reserves more per GPU, which for a
gang's whole GPUs means a bigger type that holds the gang, or fails at once when none exists;
it counts against ``max_oom_retries``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from scheduler.service.events import EventLog, event
from scheduler.service.store.records import OutcomeRecord, PlacementRecord
from workers._outcome import _requeue_after_oom, _retrying
from workers.rendezvous import node_rank_of

if TYPE_CHECKING:
    from workers.execute import WorkerContext
    from workers.runner import RunResult

__all__ = ["end_gang_rank", "gang_node_rank"]


def gang_node_rank(rec: Mapping[str, str] | None, node: str) -> int | None:
    """This node's rank in the job's gang per its job record (None: not a gang, or unreadable:
    the start then proceeds as a single-node one and the record check refuses it)."""
    raw = (rec or {}).get("placement")
    if not raw:
        return None
    try:
        p = PlacementRecord.model_validate_json(raw)
    except ValidationError:
        return None
    r = node_rank_of(p, node)
    return None if r is None else r.node_rank


def end_gang_rank(
    ctx: WorkerContext,
    events: EventLog,
    job_id: str,
    attempt: int,
    p: PlacementRecord,
    res: RunResult,
    timed_out: bool,
    option: dict[str, Any] | None,
    outcome: OutcomeRecord,
    *,
    limit: float,
    spec: dict[str, Any],
) -> dict[str, Any] | None:
    """End this node's rank; None when it was the last rank to end well (the caller then
    finishes the job as usual), else the supervisor's result. ``limit`` is the GiB per GPU
    the rank could allocate, ``spec`` the job record's spec (an OOM's retry is judged on it)."""
    rank = node_rank_of(p, ctx.node)
    assert p.gang is not None and rank is not None
    n = len(p.gang)
    if not (timed_out or res.oom or res.exit_code != 0):
        got = _retrying(ctx.store.gang_rank_done, job_id, attempt, rank.node_rank, n)
        return None if got == "last" else {"status": "succeeded", "gang": got}
    if res.oom and not timed_out:
        where = f"gang rank {rank.node_rank} of {n} on {ctx.node} (every rank stopped)"
        got = _requeue_after_oom(
            ctx, events, job_id, attempt, p, limit, res, outcome, option, spec=spec, where=where
        )
        return {"status": "gang-oom", "requeue": got}
    if timed_out:
        why = "time limit"
    elif res.oom:
        why = "out of memory"
    elif res.signal is not None:
        why = f"killed by signal {res.signal}"
    else:
        why = f"exit code {res.exit_code}"
    reason = (
        f"gang rank {rank.node_rank} of {n} on {ctx.node} failed ({why}); "
        "every rank was stopped and the gang requeued"
    )
    outcome.state, outcome.reason = "failed", reason
    _retrying(ctx.store.set_fields, job_id, {"outcome": outcome.model_dump_json()})
    got = _retrying(ctx.store.requeue, job_id, attempt, reason=reason, counter="gang")
    events.emit(
        [
            event(
                "requeued" if got == "requeued" else "finished",
                job_id,
                attempt=attempt,
                node=ctx.node,
                reason=reason if got == "requeued" else f"{reason}: {got}",
                option=option,
                outcome=outcome.model_dump(),
                simulated=outcome.simulated,
            )
        ]
    )
    return {"status": "gang-requeued", "requeue": got, "reason": reason}
