"""Recording how an attempt ended: the fenced ``finish`` / OOM ``requeue`` (retried through a
Redis restart), its events, and the measurement row the predictor's history learns from."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis

from predictor.gpus import GPU_NAMES, get_gpu
from scheduler.core.escalation import Escalation, TensorParallelRetry, escalate_oom
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
    spec: dict[str, Any] | None = None,
    where: str = "",
) -> str:
    """Requeue an OOM'd attempt by the shared rule (above the old reservation and above the
    limit it died at), on a bigger slot when it had the whole one, at a higher tensor parallel
    degree when no GPU holds it and the spec permits it (:mod:`scheduler.core.escalation`), or
    fail it at once when nothing bigger exists; returns the store's answer. ``where`` names
    the rank of a multi-node gang that ran out of memory."""
    esc = _escalation(ctx, job_id, p, spec or {})
    reason = esc.reason if not where else f"{where}: {esc.reason}"
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
            reserved_gib=None if esc.tensor_parallel else esc.reserved_gib,
            fields=None if esc.tensor_parallel is None else _retry_fields(ctx, job_id, esc),
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
                **_layout_change(spec or {}, esc.tensor_parallel),
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


def _escalation(
    ctx: WorkerContext, job_id: str, p: PlacementRecord, spec: dict[str, Any]
) -> Escalation:
    """:func:`~scheduler.core.escalation.escalate_oom` for this attempt. The record's spec is
    validated again (Redis is not trusted); one that does not parse gets no re-split."""
    from predictor.exceptions import PredictorError
    from predictor.spec import parse_spec

    pin = spec.get("gpu")
    try:
        parsed = parse_spec(spec) if spec else None
    except PredictorError as exc:
        log.warning("spec of %s unreadable, no tensor parallel retry: %s", job_id, exc)
        parsed = None
    kw: dict[str, Any] = {
        "label": p.label,
        "kind": p.kind,
        "reserved_gib": p.reserved_gib,
        "capacity_gib": p.capacity_gib,
        "gpu_type": p.gpu_type,
        "pool": ctx.pool,
        "spec": parsed,
        "gpu": pin if pin in GPU_NAMES else None,
        "job_id": job_id,
    }
    try:
        return escalate_oom(predict=ctx.predict_table, **kw)
    except Exception as exc:
        # A predictor that cannot load must not lose the outcome (the lease would lapse and
        # the job rerun as "lost"): the retry is judged without re-splitting.
        log.warning("re-predicting %s at a higher tensor parallelism failed: %s", job_id, exc)
        return escalate_oom(**kw)


def _retry_fields(ctx: WorkerContext, job_id: str, esc: Escalation) -> dict[str, str]:
    """The record fields of a retry at a new degree, as a client would have written them for
    its spec (:func:`scheduler.service.client.build_records`), with the carried-over floor. The
    history's answer was for the old layout's fingerprint: it is dropped. The spec as submitted
    is kept (``submitted_spec``, once), so resubmitting it stays a no-op."""
    from scheduler.service.client import build_records

    retry = esc.tensor_parallel
    assert retry is not None
    rec = build_records([retry.spec], retry.table)[0]
    out = {k: rec[k] for k in ("spec", "request", "predictions", "method")}
    out["reserved_gib"] = repr(float(esc.reserved_gib))
    out["history_request"] = ""
    submitted, spec = _retrying(ctx.store.get_fields, [job_id], ["submitted_spec", "spec"])[0]
    if submitted or spec:
        out["submitted_spec"] = submitted or spec
    return out


def _layout_change(spec: dict[str, Any], retry: TensorParallelRetry | None) -> dict[str, Any]:
    """The ``oom`` event's ``retry_layout``: a re-split's [from, to] per layout field."""
    if retry is None:
        return {}
    return {
        "retry_layout": {
            "tensor_parallel": [spec.get("tensor_parallel", 1), retry.spec.tensor_parallel],
            "n_gpus": [spec.get("n_gpus", 1), retry.spec.n_gpus],
        }
    }


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
