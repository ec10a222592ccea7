"""Supervising a started attempt: heartbeat its lease, stop it on a cancel, a lost lease or its
time limit, then record how it ended (:mod:`workers._outcome`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from scheduler.service.events import EventLog, event
from scheduler.service.store.records import OutcomeRecord, PlacementRecord
from workers._gang import end_gang_rank
from workers._launch import _release_slice
from workers._outcome import _end, _record_measurement, _requeue_after_oom
from workers.runner import Runner

if TYPE_CHECKING:
    from workers._rq_worker import RunTicket
    from workers.execute import WorkerContext

log = logging.getLogger("snugfit.worker")


@dataclass(frozen=True, slots=True)
class _Started:
    """A started attempt, as its supervisor needs it."""

    ctx: WorkerContext
    events: EventLog
    job_id: str
    attempt: int
    runner: Runner
    spec: dict[str, Any]
    p: PlacementRecord
    limit: float
    option: dict[str, Any] | None
    predicted: tuple[float | None, float | None]  # the predictor's (peak, runtime) for the slot
    # The RQ execution this run ends (workers._rq_worker): renewed while it runs, closed with
    # its outcome. None when run_job ran outside the node's RQ worker or inline.
    rq: RunTicket | None = None


def _supervise_guarded(run: _Started) -> None:
    ctx, job_id, attempt = run.ctx, run.job_id, run.attempt
    result: dict[str, Any] = {"status": "failed", "reason": "supervisor ended abnormally"}
    try:
        result = _supervise(run)
    except Exception as exc:
        # Redis down mid-job, etc.: the lease then lapses and the scheduler reclaims the job.
        log.exception("supervising %s attempt %s failed; its lease will lapse", job_id, attempt)
        result = {"status": "failed", "reason": f"supervising the run failed: {exc}"}
        with contextlib.suppress(Exception):
            run.runner.stop(ctx.kill_grace_s)
    finally:
        with ctx._lock:
            ctx._running.pop(f"{job_id}@{attempt}", None)
        if run.rq is not None:
            run.rq.end(result)


def _supervise(run: _Started) -> dict[str, Any]:
    """Heartbeat a started job until it ends, then record its outcome."""
    try:
        return _supervise_run(run)
    finally:
        _release_slice(run.ctx, run.p)


def _supervise_run(run: _Started) -> dict[str, Any]:
    ctx, events, job_id, attempt, runner = run.ctx, run.events, run.job_id, run.attempt, run.runner
    spec, p, limit, option = run.spec, run.p, run.limit, run.option
    time_limit = _time_limit_s(spec)
    beat = None if run.rq is None else run.rq.beat
    cancelled, lost, timed_out = _watch(ctx, job_id, attempt, runner, time_limit, beat)
    res = runner.result(limit)
    ctx.store.set_logs(job_id, res.output)
    simulated = runner.simulated
    outcome = OutcomeRecord(
        attempt=attempt,
        state="",
        exit_code=res.exit_code,
        signal=res.signal,
        peak_vram_gib=None if res.peak_vram_gib is None else round(res.peak_vram_gib, 3),
        runtime_s=round(res.runtime_s, 3),
        oom=res.oom,
        simulated=simulated,
        worker=ctx.worker_name,
        node=ctx.node,
    )
    if lost:
        events.emit(
            [
                event(
                    "finished",
                    job_id,
                    attempt=attempt,
                    node=ctx.node,
                    reason="lease lost; outcome discarded",
                    option=option,
                    simulated=simulated,
                )
            ]
        )
        return {"status": "lost"}
    if p.gang is not None and not cancelled:
        ended = end_gang_rank(
            ctx, events, job_id, attempt, p, res, timed_out, option, outcome, limit=limit, spec=spec
        )
        if ended is not None:
            return ended
    _record_measurement(ctx, job_id, attempt, spec, p, outcome, simulated, run.predicted)
    if cancelled:
        outcome.state = "cancelled"
        _end(
            ctx,
            events,
            job_id,
            attempt,
            "cancelled",
            "cancelled by user (process stopped)",
            outcome,
            option,
        )
        return {"status": "cancelled"}
    if timed_out:
        reason = (
            f"time limit: ran past time_limit_s = {time_limit:g} s; stopped with SIGTERM, "
            f"SIGKILL after {ctx.kill_grace_s:g} s"
        )
        _end(ctx, events, job_id, attempt, "failed", reason, outcome, option)
        return {"status": "failed", "reason": reason}
    if res.oom:
        got = _requeue_after_oom(
            ctx, events, job_id, attempt, p, limit, res, outcome, option, spec=spec
        )
        return {"status": "oom", "requeue": got}
    state = "succeeded" if res.exit_code == 0 else "failed"
    reason = (
        ""
        if state == "succeeded"
        else (
            f"exit code {res.exit_code}" if res.signal is None else f"killed by signal {res.signal}"
        )
    )
    outcome.state = state
    outcome.reason = reason
    _end(ctx, events, job_id, attempt, state, reason, outcome, option)
    return {"status": state, "reason": reason} if reason else {"status": state}


def _time_limit_s(spec: dict[str, Any]) -> float | None:
    v = spec.get("time_limit_s")
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if 0 < v < float("inf") else None


def _watch(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    runner: Runner,
    time_limit_s: float | None = None,
    rq_beat: Callable[[], None] | None = None,
) -> tuple[bool, bool, bool]:
    """Heartbeat until the run ends; stop it on a cancel, a lost lease or its time limit:
    (cancelled, lost, timed out). ``rq_beat`` renews the RQ execution (rate-limited there)."""
    cancelled = lost = timed_out = False
    last_logs = 0.0
    t0 = time.monotonic()
    while not runner.wait(ctx.heartbeat_s):
        try:
            hb = ctx.store.heartbeat(job_id, attempt, int(time.time() * 1000 + ctx.lease_s * 1000))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis restarting: the job keeps running. If the outage outlasts the lease, the
            # scheduler reclaims it once Redis is back and the next beat says "lost".
            log.warning("heartbeat of %s failed (%s); the job keeps running", job_id, exc)
            continue
        if hb == "cancel" and not cancelled:
            cancelled = True
            runner.stop(ctx.kill_grace_s)
        elif hb == "lost" and not lost:
            # Our lease was reclaimed: another attempt may start, so this one must end now.
            lost = True
            runner.stop(ctx.kill_grace_s)
        elif (
            time_limit_s is not None
            and not (cancelled or lost or timed_out)
            and time.monotonic() - t0 >= time_limit_s
        ):
            # Like Slurm's --time: SIGTERM, a grace period, then SIGKILL (the shim's).
            timed_out = True
            runner.stop(ctx.kill_grace_s)
        if rq_beat is not None:
            try:
                rq_beat()
            except redis.RedisError as exc:
                log.warning("renewing the RQ execution of %s failed: %s", job_id, exc)
        if time.monotonic() - last_logs > 5.0:
            last_logs = time.monotonic()
            tail = runner.output_tail()
            if tail is not None:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    ctx.store.set_logs(job_id, tail)
    return cancelled, lost, timed_out
