"""What a worker does with one placed job: ``run_job(job_id, attempt)``, the only RQ function.

RQ hands it JSON-only arguments; everything else comes from the job record in Redis, validated
(a hostile record fails the job, it never reaches ``exec``). The flow:

1. ``start`` (Lua: placed -> running, attempt fenced, lease set). A cancelled, stale or
   duplicate job stops here: two workers can never both run one attempt.
2. Run the ``command`` as an argv list (never a shell) in its own process group, with
   ``CUDA_VISIBLE_DEVICES`` (the MIG device UUID for a slice when NVML can name it) and, on a
   shared GPU, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set to the reservation; stdout+stderr go to
   a file whose tail is stored for ``logs()``. NVML samples the peak
   (:class:`workers.process.ProcessRun`). Or, on a ``--simulate`` worker,
   :class:`workers.simulated.SimulatedRun` in scaled time: both are a
   :class:`workers.runner.Runner`, supervised the same way. A real worker fails a job that has
   no ``command`` (it has nothing to run; only a simulated worker can stand one in).
3. Heartbeat every ``heartbeat_s``: renews the job's lease; a cancel request or a lost lease
   stops the process group (SIGTERM, then SIGKILL after ``kill_grace_s``).
4. Outcome (peak VRAM, runtime, exit, OOM from "CUDA out of memory" / ``torch.OutOfMemoryError``
   in the output, or a failed run whose NVML peak reached its limit) -> ``finish`` (releases
   capacity) or, on OOM, ``requeue`` by the shared rules (:mod:`scheduler.core.rules`: above
   the old reservation and above the limit the job died at).
5. A measurement row (``origin="history"``, ``simulated`` when simulated) to ``P:history`` and
   the worker's JSONL history file, with the predictor's figures for the slot in ``hardware``
   (``predicted_peak_gib``, ``predicted_runtime_s``) so the leader's history learns ratios; an
   OOM row's peak is the limit, a lower bound. Events to the stream and the worker's JSONL log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from pydantic import ValidationError

from predictor._execution import check_env, check_workdir
from predictor.exceptions import SpecError
from predictor.gpus import GPU_NAMES, get_gpu
from predictor.history import fingerprint_dict
from scheduler.core.escalation import escalate_after_oom, largest_slot_gib
from scheduler.core.pool import Pool
from scheduler.core.requests import TYPE_INDEX
from scheduler.core.rules import memory_limit_gib
from scheduler.service.events import EventLog, event
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import OutcomeRecord, PlacementRecord, dumps
from workers.engines import engine_env, engine_values, fill_placeholders
from workers.environment import job_environment
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
    # Seed of the simulated truth (scheduler.sim.truth.draw_truth), as the simulator's.
    truth_seed: int = 0
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
    # The node's MIG slices (workers.mig.MigSlices): created per job on a dynamic layout.
    mig: Any = None
    # The node's MPS daemons (workers.mps.MpsDaemons) on a shared node: each client's limits.
    mps: Any = None
    # The pool (when known): an OOM retry that no GPU of it can hold fails at once.
    pool: Pool | None = None
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


class PlacementUnavailable(Exception):
    """The node cannot give the job what its placement says (a MIG slice it cannot find)."""


def _device_vars(ctx: WorkerContext, p: PlacementRecord) -> dict[str, str]:
    """The variables that tell the job which devices it has (and, shared, its MPS limits)."""
    out: dict[str, str] = {}
    local = [ctx.local_index.get(g, g) for g in p.gpu_indices]
    if p.kind == "mig":
        mig_key = (p.gpu_indices[0], p.mig_profile or "", p.mig_start or 0)
        if ctx.mig is not None:
            from workers.mig import SliceUnavailable

            try:
                ctx.mig.acquire(*mig_key)
            except SliceUnavailable as exc:
                raise PlacementUnavailable(f"node {ctx.node}: {exc}") from None
        uuid = ctx.mig_uuids.get(mig_key)
        if uuid is None:
            # Never the parent GPU's index or UUID: that would hand the job the whole GPU.
            raise PlacementUnavailable(
                f"MIG slice {p.mig_profile}@{p.mig_start} of GPU {local[0]} not found on node "
                f"{ctx.node} (NVML lists {sorted(ctx.mig_uuids) or 'no MIG devices'}); "
                "refusing to fall back to the whole GPU. Check `nvidia-smi -L` against the pool"
            )
        # A MIG slice is addressed by its own UUID: an index would expose the whole parent GPU.
        out["CUDA_VISIBLE_DEVICES"] = uuid
        out["SNUGFIT_MIG_PROFILE"] = f"{p.mig_profile}@{p.mig_start}"
    else:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in local)
    if p.kind == "shared" and ctx.mps is not None:
        out.update(ctx.mps.client_env(local[0], p.reserved_gib, p.capacity_gib))
    elif p.kind == "shared":
        mib = int(p.reserved_gib * 1024 + 0.999)
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
    out["SNUGFIT_JOB_ID"] = p.rq_job_id
    out["SNUGFIT_ATTEMPT"] = str(p.attempt)
    return out


def _env_for(
    ctx: WorkerContext, p: PlacementRecord, spec: dict[str, Any] | None = None
) -> dict[str, str]:
    """The job's whole environment: its own ``env`` plus its devices, never the worker's."""
    spec_env = (spec or {}).get("env")
    return job_environment(spec_env if isinstance(spec_env, dict) else None, _device_vars(ctx, p))


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
    return memory_limit_gib(p.kind, p.reserved_gib, p.capacity_gib)


def _predicted_for_slot(
    rec: dict[str, str], p: PlacementRecord, predictions: dict[str, Any]
) -> tuple[float | None, float | None]:
    """The predictor's own (peak GiB, runtime s) for this slot: the submitted prediction on its
    type, and the option's runtime with any history adjustment taken out (the option prices the
    request the leader placed, which history may have changed)."""
    pred = predictions.get(p.gpu_type) or {}
    peak = pred.get("peak_vram_gib")
    runtime = p.runtime_s
    try:
        t = TYPE_INDEX[p.gpu_type]
        base = json.loads(rec.get("request") or "{}").get("runtime_s") or []
        used = json.loads(rec.get("history_request") or rec.get("request") or "{}")
        own = (used.get("runtime_s") or [])[t]
        if runtime is not None and own and base[t]:
            runtime = runtime * float(base[t]) / float(own)
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        pass
    return (None if peak is None else float(peak)), runtime


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
    # Retried through a Redis restart: a failed start would leave the job placed, its RQ job
    # spent, until the placement lease (minutes). start.lua answers "ok" to the same worker.
    got = _retrying(
        ctx.store.start, job_id, attempt, ctx.worker_name, now_ms + int(ctx.lease_s * 1000)
    )
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
    simulated = ctx.simulate
    option = _option_of(ctx, job_id)
    if simulated:
        # The leader placed it without knowing; the run is simulated, and every record says so.
        p.simulated = True
        ctx.store.set_fields(job_id, {"simulated": "1", "placement": p.model_dump_json()})
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
    runner = _runner_for(ctx, job_id, attempt, p, argv, _predicted_for_slot(rec, p, predictions),
                         spec, limit, predictions)  # fmt: skip
    if isinstance(runner, str):
        return _fail_before_start(ctx, events, job_id, attempt, runner)
    try:
        runner.start()
    except OSError as exc:
        _release_slice(ctx, p)
        reason = f"could not start {argv[0]!r}: {exc.strerror or exc}"
        return _fail_before_start(ctx, events, job_id, attempt, reason)
    # Started here, on RQ's (main) thread, and only then handed over: PR_SET_PDEATHSIG fires
    # when the *thread* that forked the job exits, so a job forked by a short-lived supervisor
    # thread would be killed with it; the main thread lives as long as the worker.
    run = _Started(ctx, events, job_id, attempt, runner, spec, p, limit, option,
                   _predicted_for_slot(rec, p, predictions))  # fmt: skip
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
    predicted: tuple[float | None, float | None]  # the predictor's (peak, runtime) for the slot


def _runner_for(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    p: PlacementRecord,
    argv: Any,
    predicted: tuple[float | None, float | None],
    spec: dict[str, Any],
    limit: float,
    predictions: dict[str, Any],
) -> Runner | str:
    """The runner of this attempt, or why it cannot run."""
    if ctx.simulate:
        peak, runtime = predicted
        replica = _is_replica(spec)
        if replica:  # a serving replica runs its deployment's duration, or until stopped
            runtime = float((spec or {}).get("duration_s") or math.inf)
        return SimulatedRun(
            job_id,
            attempt,
            fingerprint=fingerprint_dict(spec),
            seed=ctx.truth_seed,
            predicted_peak_gib=float(peak or p.reserved_gib),
            predicted_runtime_s=float(runtime or 1.0),
            limit_gib=limit,
            time_scale=ctx.time_scale,
            label=f"{ctx.node} ({p.label})",
            exact=replica,
        )
    if not argv:
        return (
            "the job has no `command`, and this worker runs real commands; give the job a "
            "`command` (argv list), or run `snugfit worker --simulate` to simulate it"
        )
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "`command` must be a non-empty list of strings (argv; no shell)"
    try:
        # Checked again here: the record in Redis is not trusted to be what the client wrote.
        spec_env = check_env(spec.get("env"))
        workdir = check_workdir(spec.get("workdir"))
        # Serving engines are told the memory they were reserved (workers/engines.py).
        pred = predictions.get(p.gpu_type)
        breakdown = pred.get("breakdown_gib") if isinstance(pred, dict) else None
        told = engine_values(p.reserved_gib, p.capacity_gib, breakdown)
        # A serving replica also carries its plan's values (TP size, max-num-seqs, KV dtype,
        # quantization, ...), which take precedence: the planner sized the engine for its slot.
        told.update(p.engine or {})
        argv = [fill_placeholders(a, told) for a in argv]
        spec_env = {k: fill_placeholders(v, told) for k, v in (spec_env or {}).items()}
        worker_vars = engine_env(told, p.reserved_gib) | _device_vars(ctx, p)
        env = job_environment(spec_env, worker_vars)
    except (SpecError, PlacementUnavailable) as exc:
        return str(exc)
    local = [ctx.local_index.get(g, g) for g in p.gpu_indices]
    return ProcessRun(
        argv,
        env,
        ctx.nvml,
        local if p.kind != "shared" else [],
        workdir=workdir,
        grace_s=ctx.kill_grace_s,
    )


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


def _release_slice(ctx: WorkerContext, p: PlacementRecord) -> None:
    """Destroy the MIG slice created for this attempt (dynamic layouts; others keep theirs)."""
    if ctx.mig is not None and p.kind == "mig":
        ctx.mig.release(p.gpu_indices[0], p.mig_profile or "", p.mig_start or 0)


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
    cancelled, lost, timed_out = _watch(ctx, job_id, attempt, runner, time_limit)
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
            ctx, events, job_id, attempt, p, limit, res, outcome, option, gpu_pin=spec.get("gpu")
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
    return {"status": state}


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
) -> tuple[bool, bool, bool]:
    """Heartbeat until the run ends; stop it on a cancel, a lost lease or its time limit:
    (cancelled, lost, timed out)."""
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
        if time.monotonic() - last_logs > 5.0:
            last_logs = time.monotonic()
            tail = runner.output_tail()
            if tail is not None:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    ctx.store.set_logs(job_id, tail)
    return cancelled, lost, timed_out


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
