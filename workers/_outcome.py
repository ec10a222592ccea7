"""Recording how an attempt ended: the fenced ``finish`` / OOM ``requeue`` (retried through a
Redis restart), its events, and the measurement row the predictor's history learns from."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import redis

from predictor.gpus import GPU_NAMES, get_gpu
from scheduler.core.escalation import escalate_after_oom, largest_slot_gib
from scheduler.service.events import EventLog, event
from scheduler.service.store.records import OutcomeRecord, PlacementRecord, dumps
from workers._launch import _is_replica, _limit_gib
from workers.runner import RunResult

if TYPE_CHECKING:
    from workers.execute import WorkerContext

log = logging.getLogger("snugfit.worker")


def _requeue_after_oom(
    ctx: WorkerContext,
    events: EventLog,
    job_id: str,
    attempt: int,
    p: PlacementRecord,
    limit: float,
    res: RunResult,
    outcome: OutcomeRecord,
    option: dict[str, Any] | None,
    gpu_pin: Any = None,
) -> str:
    """Requeue an OOM'd attempt by the shared rule (above the old reservation and above the
    limit it died at), on a bigger slot when it had the whole one
    (:mod:`scheduler.core.escalation`), or fail it at once when nothing bigger exists; returns
    the store's answer."""
    pin = gpu_pin if gpu_pin in GPU_NAMES else None
    esc = escalate_after_oom(
        label=p.label,
        kind=p.kind,
        reserved_gib=p.reserved_gib,
        capacity_gib=p.capacity_gib,
        largest_gib=math.inf if ctx.pool is None else largest_slot_gib(ctx.pool, pin),
    )
    reason = esc.reason
    outcome.state = "oom"
    outcome.reason = reason
    _retrying(ctx.store.set_fields, job_id, {"outcome": outcome.model_dump_json()})
    if esc.possible:
        got = _retrying(
            ctx.store.requeue,
            job_id,
            attempt,
            reason=reason,
            counter="ooms",
            reserved_gib=esc.reserved_gib,
        )
    else:
        got = _retrying(
            ctx.store.finish, job_id, attempt, "failed", outcome.model_dump_json(), reason
        )
        got = "failed" if got == "ok" else got
    events.emit(
        [
            event(
                "oom",
                job_id,
                attempt=attempt,
                node=ctx.node,
                reason=reason,
                option=option,
                outcome=outcome.model_dump(),
                simulated=outcome.simulated,
            ),
            event(
                "requeued" if got == "requeued" else "finished",
                job_id,
                attempt=attempt,
                node=ctx.node,
                reason=f"after OOM: {got}",
                option=option,
                simulated=outcome.simulated,
            ),
        ]
    )
    return got


#: How long a finished attempt keeps retrying to record its outcome while Redis is down; past
#: that its lease lapses and the scheduler requeues it (it runs again: at least once).
_OUTCOME_RETRY_S = 120.0


def _retrying(fn: Any, *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)``, retried with backoff on Redis connection errors. Each transition is
    a fenced Lua script, so a retry after a lost reply answers "stale", never acts twice."""
    deadline = time.monotonic() + _OUTCOME_RETRY_S
    delay = 0.1
    while True:
        try:
            return fn(*args, **kw)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("Redis unreachable (%s); retrying in %.1f s", exc, delay)
            time.sleep(delay)
            delay = min(2.0, delay * 2)


def _fail_before_start(
    ctx: WorkerContext, events: EventLog, job_id: str, attempt: int, reason: str
) -> dict[str, Any]:
    """End an attempt that never ran (corrupt record, bad argv, exec failure)."""
    _end(
        ctx,
        events,
        job_id,
        attempt,
        "failed",
        reason,
        OutcomeRecord(attempt=attempt, state="failed", reason=reason),
    )
    return {"status": "failed", "reason": reason}


def _end(
    ctx: WorkerContext,
    events: EventLog,
    job_id: str,
    attempt: int,
    state: str,
    reason: str,
    outcome: OutcomeRecord,
    option: dict[str, Any] | None = None,
) -> None:
    outcome.state = state
    outcome.reason = reason
    got = _retrying(ctx.store.finish, job_id, attempt, state, outcome.model_dump_json(), reason)
    kind = "cancelled" if state == "cancelled" else "finished"
    if got == "requeued":  # `snugfit requeue` of a running job: stopped, then back to pending
        kind, reason, got = "requeued", "requeued by user (process stopped)", "ok"
    events.emit(
        [
            event(
                kind,
                job_id,
                attempt=attempt,
                node=ctx.node,
                reason=reason or state if got == "ok" else f"{state} ignored: {got}",
                option=option,
                outcome=outcome.model_dump(),
                simulated=outcome.simulated,
            )
        ]
    )


def _record_measurement(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    spec: dict[str, Any],
    p: PlacementRecord,
    o: OutcomeRecord,
    simulated: bool,
    predicted: tuple[float | None, float | None] = (None, None),
) -> None:
    from predictor.exceptions import PredictorError
    from predictor.measurements import append_measurement, measurement_row

    if _is_replica(spec):
        return  # an engine's peak is its memory fraction: it says nothing the predictor learns
    ok = o.exit_code == 0
    p_limit = _limit_gib(p)
    peak = o.peak_vram_gib if (o.peak_vram_gib or 0) > 0 else None
    if not ok and not o.oom and peak is None:
        return  # nothing was measured
    try:
        gpu = get_gpu(p.gpu_type)
        row = measurement_row(
            id=f"{job_id}@{attempt}",
            origin="history",
            simulated=simulated,
            source=f"snugfit worker {ctx.worker_name} node {ctx.node}, job {job_id}@{attempt}",
            spec=spec,
            gpu=p.gpu_type,
            gpu_model=gpu.name,
            gpu_memory_gib=gpu.memory_gib,
            peak_vram_gib=peak,
            measurement="unknown" if simulated else "nvml_used",
            runtime_s=o.runtime_s if ok and o.runtime_s else None,
            oom=o.oom,
            confidence="low" if simulated else "medium",
            hardware={
                "node": ctx.node,
                "slot": p.label,
                "reserved_gib": p.reserved_gib,
                "limit_gib": round(p_limit, 3),
                "exit_ok": ok,
                "predicted_peak_gib": predicted[0],
                "predicted_runtime_s": predicted[1],
            },
            notes=("SIMULATED run (workers.simulated): not a measurement. " if simulated else "")
            + (f"ran on {p.label}; " if p.kind != "whole" else "")
            + ("OOM: peak is a lower bound" if o.oom else ""),
        )
    except (PredictorError, ValueError) as exc:
        log.warning("measurement row for %s not recorded: %s", job_id, exc)
        return
    ctx.store.append_history(dumps(row))
    if ctx.history_path is not None:
        append_measurement(ctx.history_path, row)
