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
5. The RQ job ends with the run (:mod:`workers._rq_worker`): it stays ``started`` while the
   supervisor runs, then ``finished``, ``failed`` or ``canceled`` with the run's outcome.
6. A measurement row (``origin="history"``, ``simulated`` when simulated) to ``P:history`` and
   the worker's JSONL history file, with the predictor's figures for the slot in ``hardware``
   (``predicted_peak_gib``, ``predicted_runtime_s``) so the leader's history learns ratios; an
   OOM row's peak is the limit, a lower bound. Events to the stream and the worker's JSONL log.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from scheduler.core.pool import Pool
from scheduler.service.events import EventLog, event
from scheduler.service.store.protocol import Store
from scheduler.service.store.records import PlacementRecord
from workers._gang import gang_node_rank

# Re-exported (explicitly, ``as``): callers and tests import these from here.
from workers._launch import PlacementUnavailable as PlacementUnavailable
from workers._launch import _env_for as _env_for
from workers._launch import _limit_gib, _predicted_for_slot, _release_slice, _runner_for
from workers._outcome import _fail_before_start, _retrying
from workers._rq_worker import take_ticket
from workers._supervise import _Started, _supervise, _supervise_guarded
from workers.nvml import Nvml
from workers.rendezvous import node_rank_of
from workers.runner import Runner

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
    # What an OOM retry at a higher tensor parallel degree is re-predicted with (None: the
    # client's default, the tiered predictor, loaded on first use).
    predict: Any = None
    _running: dict[str, threading.Thread] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def predict_table(self, specs: Any) -> Any:
        """``predict(specs)``: a PredictionTable, one row per spec."""
        if self.predict is None:
            from scheduler.service.client import default_table_fn

            self.predict = default_table_fn()
        return self.predict(specs)

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


def run_job(job_id: Any, attempt: Any) -> dict[str, Any]:
    """The RQ entry point. Never raises for a bad payload: it is rejected and logged."""
    ctx = current_context()
    events = ctx.events or EventLog(ctx.store)
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200 or type(attempt) is not int:
        reason = f"refused RQ job with bad arguments ({job_id!r:.60}, {attempt!r:.20})"
        log.warning(reason)
        events.emit([event("invalid", None, reason=reason, node=ctx.node)])
        return {"status": "invalid", "reason": reason}
    got = _claim(ctx, job_id, attempt)
    if got != "ok":
        log.info("not running %s attempt %s: %s", job_id, attempt, got)
        if got == "missing":
            events.emit([event("invalid", job_id, reason="no such job", node=ctx.node)])
        return {"status": "skipped", "reason": got}
    rec = ctx.store.get_job(job_id) or {}
    job = _read_record(ctx, rec)
    if isinstance(job, str):
        return _fail_before_start(ctx, events, job_id, attempt, job)
    p, spec, predictions = job.p, job.spec, job.predictions
    option = _announce_start(ctx, events, job_id, attempt, p)
    # The runner is built after the event: the started event goes out as soon as the attempt
    # is ours (building a simulated run first loads the residual model).
    limit = _limit_gib(p)
    predicted = _predicted_for_slot(rec, p, predictions)
    runner = _start_runner(ctx, job_id, attempt, job, predicted, limit)
    if isinstance(runner, str):
        return _fail_before_start(ctx, events, job_id, attempt, runner)
    run = _Started(ctx, events, job_id, attempt, runner, spec, p, limit, option, predicted)
    return _hand_over(run)


def _claim(ctx: WorkerContext, job_id: str, attempt: int) -> str:
    """``start.lua``'s answer for this attempt: "ok" when it is ours to run (placed -> running,
    attempt fenced, lease set), else why not (cancelled, stale, duplicate, missing)."""
    now_ms = int(time.time() * 1000)
    # Retried through a Redis restart: a failed start would leave the job placed, its RQ job
    # spent, until the placement lease (minutes). start.lua answers "ok" to the same worker.
    got: str = _retrying(
        ctx.store.start,
        job_id,
        attempt,
        ctx.worker_name,
        now_ms + int(ctx.lease_s * 1000),
        gang_node_rank(ctx.store.get_job(job_id), ctx.node),
    )
    return got


class _JobRecord(NamedTuple):
    """What ``run_job`` reads from the job record, validated."""

    p: PlacementRecord
    spec: dict[str, Any]
    predictions: dict[str, Any]
    argv: Any  # the spec's ``command`` (None: nothing to run; the runner decides)


def _read_record(ctx: WorkerContext, rec: dict[str, str]) -> _JobRecord | str:
    """The job record's placement, spec and predictions, validated; or why it is corrupt."""
    try:
        p = PlacementRecord.model_validate_json(rec.get("placement", ""))
        spec = json.loads(rec.get("spec", ""))
        predictions = json.loads(rec.get("predictions", "{}"))
        if not isinstance(predictions, dict):
            # Predictions only feed predicted-vs-actual and the engine's told breakdown: any
            # other JSON (anyone with Redis write access can store one) reads as none.
            predictions = {}
        argv = spec.get("command")
        if p.node != ctx.node and node_rank_of(p, ctx.node) is None:
            raise ValueError(f"placed on node {p.node!r}, but this worker serves {ctx.node!r}")
    except (ValidationError, ValueError, AttributeError) as exc:
        return f"corrupt job record: {str(exc).splitlines()[0][:200]}"
    return _JobRecord(p, spec, predictions, argv)


def _announce_start(
    ctx: WorkerContext, events: EventLog, job_id: str, attempt: int, p: PlacementRecord
) -> dict[str, Any] | None:
    """Mark a simulated run on the record and emit ``started``; the committed option, for the
    events that follow."""
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
    return option


def _start_runner(
    ctx: WorkerContext,
    job_id: str,
    attempt: int,
    job: _JobRecord,
    predicted: tuple[float | None, float | None],
    limit: float,
) -> Runner | str:
    """The attempt's runner (a process, or a simulated run), started; or why it could not be."""
    p, spec, predictions, argv = job
    runner = _runner_for(ctx, job_id, attempt, p, argv, predicted, spec, limit, predictions)
    if isinstance(runner, str):
        return runner
    try:
        runner.start()
    except OSError as exc:
        _release_slice(ctx, p)
        return f"could not start {argv[0]!r}: {exc.strerror or exc}"
    return runner


def _hand_over(run: _Started) -> dict[str, Any]:
    """Supervise a started run to its end here (inline mode), or on its own thread (concurrent).

    Started on RQ's (main) thread, and only then handed over: PR_SET_PDEATHSIG fires when the
    *thread* that forked the job exits, so a job forked by a short-lived supervisor thread
    would be killed with it; the main thread lives as long as the worker.
    """
    ctx = run.ctx
    if not ctx.concurrent:
        return _supervise(run)
    # The RQ job stays `started` until the supervisor ends it with the run's outcome.
    run = replace(run, rq=take_ticket())
    key = f"{run.job_id}@{run.attempt}"
    thread = threading.Thread(
        target=_supervise_guarded, args=(run,), name=f"snugfit-job-{key}", daemon=True
    )
    with ctx._lock:
        ctx._running[key] = thread
    thread.start()
    return {"status": "started", "concurrent": True}
