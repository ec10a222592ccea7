"""What a worker does with one placed job: ``run_job(job_id, attempt)``, the only RQ function.

RQ hands it JSON-only arguments; everything else comes from the job record in Redis, validated
(a hostile record fails the job, it never reaches ``exec``). The flow:

1. ``start`` (Lua: placed -> running, attempt fenced, lease set). A cancelled, stale or
   duplicate job stops here: two workers can never both run one attempt.
2. Run the ``command`` as an argv list (never a shell) in its own process group, with
   ``CUDA_VISIBLE_DEVICES`` (the MIG device UUID for a slice when NVML can name it) and, on a
   shared GPU, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set to the reservation; stdout+stderr go to
   a file whose tail is stored for ``logs()``. NVML samples the peak
   (:class:`workers.process.ProcessRun`). Or, on a ``--simulate`` worker or for a job without
   a command, :class:`workers.simulated.SimulatedRun` in scaled time: both are a
   :class:`workers.runner.Runner`, supervised the same way.
3. Heartbeat every ``heartbeat_s``: renews the job's lease; a cancel request or a lost lease
   stops the process group (SIGTERM, then SIGKILL after ``kill_grace_s``).
4. Outcome (peak VRAM, runtime, exit, OOM from "CUDA out of memory" / ``torch.OutOfMemoryError``
   in the output, or a failed run whose NVML peak reached its limit) -> ``finish`` (releases
   capacity) or, on OOM, ``requeue`` with a reservation ``oom_growth`` times larger.
5. A measurement row (``origin="history"``, ``simulated`` when simulated) to ``P:history`` and
   the worker's JSONL history file; events to the stream and the worker's JSONL log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from predictor.gpus import get_gpu
from scheduler.service.events import EventLog, event
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import OutcomeRecord, PlacementRecord, dumps
from workers.nvml import Nvml
from workers.process import ProcessRun
from workers.runner import Runner, RunResult
from workers.simulated import SimulatedRun

__all__ = ["WorkerContext", "current_context", "run_job", "set_context"]

log = logging.getLogger("snugfit.worker")


@dataclass
class WorkerContext:
    """Everything ``run_job`` needs that is not in the job record (one per worker process)."""

    store: Store
    node: str
    worker_name: str
    simulate: bool = False
    time_scale: float = 1.0
    lease_s: float = 10.0
    heartbeat_s: float = 1.0
    kill_grace_s: float = 5.0
    oom_growth: float = 1.25
    history_path: Path | None = None
    events: EventLog | None = None
    nvml: Nvml | None = None
    # Pool GPU index -> NVML index on this node (and MIG device UUIDs where known).
    local_index: dict[int, int] = field(default_factory=dict)
    gpu_uuids: dict[int, str] = field(default_factory=dict)
    # (pool GPU index, MIG profile, start slice) -> MIG device UUID, from NVML enumeration.
    mig_uuids: dict[tuple[int, str, int], str] = field(default_factory=dict)
    # Concurrent mode (the node worker): ``run_job`` starts the job and hands it to a supervisor
    # thread, so every job placed on the node runs at once instead of one after another while
    # the others' GPUs sit reserved. Inline mode (direct callers, tests) runs it to the end.
    concurrent: bool = False
    _running: dict[str, threading.Thread] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def running(self) -> list[str]:
        """``job@attempt`` of every job this worker is supervising now."""
        with self._lock:
            return [k for k, t in self._running.items() if t.is_alive()]

    def join_running(self, timeout_s: float | None = None) -> bool:
        """Wait for every supervised job to end; True when none is left."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                threads = list(self._running.values())
            if not threads:
                return True
            for t in threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                t.join(left)
                if deadline is not None and time.monotonic() >= deadline:
                    return not self.running()


_CONTEXT: WorkerContext | None = None


def set_context(ctx: WorkerContext | None) -> None:
    global _CONTEXT
    _CONTEXT = ctx


def current_context() -> WorkerContext:
    if _CONTEXT is None:
        raise RuntimeError(
            "workers.execute.run_job runs only inside `snugfit worker` (no worker context set)"
        )
    return _CONTEXT


def _env_for(ctx: WorkerContext, p: PlacementRecord) -> dict[str, str]:
    env = dict(os.environ)
    local = [ctx.local_index.get(g, g) for g in p.gpu_indices]
    mig_key = (p.gpu_indices[0], p.mig_profile or "", p.mig_start or 0)
    if p.kind == "mig" and mig_key in ctx.mig_uuids:
        # A MIG slice is addressed by its own UUID: an index would expose the whole parent GPU.
        env["CUDA_VISIBLE_DEVICES"] = ctx.mig_uuids[mig_key]
    elif p.kind == "mig" and p.gpu_indices[0] in ctx.gpu_uuids:
        env["CUDA_VISIBLE_DEVICES"] = ctx.gpu_uuids[p.gpu_indices[0]]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in local)
    if p.kind == "mig":
        env["SNUGFIT_MIG_PROFILE"] = f"{p.mig_profile}@{p.mig_start}"
    if p.kind == "shared":
        mib = int(p.reserved_gib * 1024 + 0.999)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
    env["SNUGFIT_JOB_ID"] = p.rq_job_id
    return env


def _option_of(ctx: WorkerContext, job_id: str) -> dict[str, Any] | None:
    """The committed option (its allocation's ``option``), for the events: read while held."""
    try:
        raw = ctx.store.allocations([job_id]).get(job_id)
        got = json.loads(raw) if raw else None
    except (ValueError, TypeError) as exc:
        log.warning("allocation of %s unreadable: %s", job_id, exc)
        return None
    opt = got.get("option") if isinstance(got, dict) else None
    return opt if isinstance(opt, dict) else None


def _limit_gib(p: PlacementRecord) -> float:
    # What the job may really use: its MPS limit on a shared GPU, else the slot (GPU or slice).
    return p.reserved_gib if p.kind == "shared" else p.capacity_gib


def run_job(job_id: Any, attempt: Any) -> dict[str, Any]:
    """The RQ entry point. Never raises for a bad payload: it is rejected and logged."""
    ctx = current_context()
    events = ctx.events or EventLog(ctx.store)
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200 or type(attempt) is not int:
        reason = f"refused RQ job with bad arguments ({job_id!r:.60}, {attempt!r:.20})"
        log.warning(reason)
        events.emit([event("invalid", None, reason=reason, node=ctx.node)])
        return {"status": "invalid", "reason": reason}
    now_ms = int(time.time() * 1000)
    got = ctx.store.start(job_id, attempt, ctx.worker_name, now_ms + int(ctx.lease_s * 1000))
    if got != "ok":
        log.info("not running %s attempt %s: %s", job_id, attempt, got)
        if got == "missing":
            events.emit([event("invalid", job_id, reason="no such job", node=ctx.node)])
        return {"status": "skipped", "reason": got}
    rec = ctx.store.get_job(job_id) or {}
    try:
        p = PlacementRecord.model_validate_json(rec.get("placement", ""))
        spec = json.loads(rec.get("spec", ""))
        predictions = json.loads(rec.get("predictions", "{}"))
        argv = spec.get("command")
        if p.node != ctx.node:
            raise ValueError(f"placed on node {p.node!r}, but this worker serves {ctx.node!r}")
    except (ValidationError, ValueError, AttributeError) as exc:
        reason = f"corrupt job record: {str(exc).splitlines()[0][:200]}"
        return _fail_before_start(ctx, events, job_id, attempt, reason)
    simulated = _runs_simulated(ctx, argv)
    option = _option_of(ctx, job_id)
    if simulated:
        ctx.store.set_fields(job_id, {"simulated": "1"})
    events.emit(
        [
            event(
                "started",
                job_id,
                attempt=attempt,
                node=ctx.node,
                reason=f"worker {ctx.worker_name}",
                option=option,
                simulated=simulated,
            )
        ]
    )
    # The runner is built after the event: the started event goes out as soon as the attempt
    # is ours (building a simulated run first loads the residual model).
    limit = _limit_gib(p)
    runner = _runner_for(ctx, job_id, attempt, p, argv, predictions, limit, spec)
    if isinstance(runner, str):
        return _fail_before_start(ctx, events, job_id, attempt, runner)
    try:
        runner.start()
    except OSError as exc:
        reason = f"could not start {argv[0]!r}: {exc.strerror or exc}"
        return _fail_before_start(ctx, events, job_id, attempt, reason)
    # Started here, on RQ's (main) thread, and only then handed over: PR_SET_PDEATHSIG fires
    # when the *thread* that forked the job exits, so a job forked by a short-lived supervisor
    # thread would be killed with it; the main thread lives as long as the worker.
    run = _Started(ctx, events, job_id, attempt, runner, spec, p, limit, option)
    if ctx.concurrent:
        key = f"{job_id}@{attempt}"
        thread = threading.Thread(
            target=_supervise_guarded,
            args=(run,),
            name=f"snugfit-job-{key}",
            daemon=True,
        )
        with ctx._lock:
            ctx._running[key] = thread
        thread.start()
        return {"status": "started", "concurrent": True}
    return _supervise(run)


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


def _runs_simulated(ctx: WorkerContext, argv: Any) -> bool:
    """A job without a command, or any job on a ``--simulate`` worker, runs simulated (and
    says so everywhere)."""
    return ctx.simulate or not argv


def _runner_for(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    p: PlacementRecord,
    argv: Any,
    predictions: dict[str, Any],
    limit: float,
    spec: dict[str, Any] | None = None,
) -> Runner | str:
    """The runner of this attempt, or why it cannot run."""
    if _runs_simulated(ctx, argv):
        pred = predictions.get(p.gpu_type, {})
        runtime = float(p.runtime_s or pred.get("runtime_s") or 1.0)
        replica = _is_replica(spec)
        if replica:  # a serving replica runs its deployment's duration, or until stopped
            runtime = float((spec or {}).get("duration_s") or math.inf)
        return SimulatedRun(
            job_id,
            attempt,
            predicted_peak_gib=float(pred.get("peak_vram_gib") or p.reserved_gib),
            predicted_runtime_s=runtime,
            limit_gib=limit,
            time_scale=ctx.time_scale,
            label=f"{ctx.node} ({p.label})",
            exact=replica,
        )
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "`command` must be a non-empty list of strings (argv; no shell)"
    local = [ctx.local_index.get(g, g) for g in p.gpu_indices]
    return ProcessRun(argv, _env_for(ctx, p), ctx.nvml, local if p.kind != "shared" else [])


def _is_replica(spec: dict[str, Any] | None) -> bool:
    """A serving deployment's replica (``task: serve``; see scheduler.service.deployments)."""
    return isinstance(spec, dict) and spec.get("task") == "serve"


def _supervise_guarded(run: _Started) -> None:
    ctx, job_id, attempt = run.ctx, run.job_id, run.attempt
    try:
        _supervise(run)
    except Exception:
        # Redis down mid-job, etc.: the lease then lapses and the scheduler reclaims the job.
        log.exception("supervising %s attempt %s failed; its lease will lapse", job_id, attempt)
        with contextlib.suppress(Exception):
            run.runner.stop(ctx.kill_grace_s)
    finally:
        with ctx._lock:
            ctx._running.pop(f"{job_id}@{attempt}", None)


def _supervise(run: _Started) -> dict[str, Any]:
    """Heartbeat a started job until it ends, then record its outcome."""
    ctx, events, job_id, attempt, runner = run.ctx, run.events, run.job_id, run.attempt, run.runner
    spec, p, limit, option = run.spec, run.p, run.limit, run.option
    cancelled, lost = _watch(ctx, job_id, attempt, runner)
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
    _record_measurement(ctx, job_id, attempt, spec, p, outcome, simulated)
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
    if res.oom:
        got = _requeue_after_oom(ctx, events, job_id, attempt, p, limit, res, outcome, option)
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
    return {"status": state}


def _watch(ctx: WorkerContext, job_id: str, attempt: int, runner: Runner) -> tuple[bool, bool]:
    """Heartbeat until the run ends; stop it on a cancel or a lost lease: (cancelled, lost)."""
    cancelled = lost = False
    last_logs = 0.0
    while not runner.wait(ctx.heartbeat_s):
        hb = ctx.store.heartbeat(job_id, attempt, int(time.time() * 1000 + ctx.lease_s * 1000))
        if hb == "cancel" and not cancelled:
            cancelled = True
            runner.stop(ctx.kill_grace_s)
        elif hb == "lost" and not lost:
            # Our lease was reclaimed: another attempt may start, so this one must end now.
            lost = True
            runner.stop(ctx.kill_grace_s)
        if time.monotonic() - last_logs > 5.0:
            last_logs = time.monotonic()
            tail = runner.output_tail()
            if tail is not None:
                ctx.store.set_logs(job_id, tail)
    return cancelled, lost


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
) -> str:
    """Requeue an OOM'd attempt with a larger reservation; returns the store's answer."""
    new_res = max(p.reserved_gib * ctx.oom_growth, (res.peak_vram_gib or 0.0) * 1.1)
    reason = (
        f"CUDA OOM on {p.label}: reserved {p.reserved_gib:.2f} GiB, limit {limit:.2f} GiB; "
        f"requeued with {new_res:.2f} GiB"
    )
    outcome.state = "oom"
    outcome.reason = reason
    ctx.store.set_fields(job_id, {"outcome": outcome.model_dump_json()})
    got = ctx.store.requeue(job_id, attempt, reason=reason, counter="ooms", reserved_gib=new_res)
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
    got = ctx.store.finish(job_id, attempt, state, outcome.model_dump_json(), reason)
    kind = "cancelled" if state == "cancelled" else "finished"
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
) -> None:
    from predictor.exceptions import PredictorError
    from predictor.measurements import append_measurement, measurement_row

    if _is_replica(spec):
        return  # an engine's peak is its memory fraction: it says nothing the predictor learns
    ok = o.exit_code == 0
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
            hardware={"node": ctx.node, "slot": p.label, "reserved_gib": p.reserved_gib},
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
