"""The node's RQ worker: an RQ job stays ``started`` for as long as its snugfit run lasts.

``run_job`` on a node worker only *starts* a run and hands it to a supervisor thread, so that
every job placed on the node runs at once from one RQ loop on the node's one queue. Plain
:class:`rq.SimpleWorker` would then mark the RQ job ``finished`` the moment ``run_job``
returns (about 10 ms in), show the worker ``idle`` while it runs jobs, and call a cancelled
job ``finished``. Here each execution gets a :class:`RunTicket`; ``run_job`` takes it
(:func:`take_ticket`) when it hands the run over, and the supervisor beats it while the run
lasts and ends it with the run's outcome. Until then the job is in RQ's
``StartedJobRegistry`` with its execution heart-beaten, and the worker's published state is
``busy`` while any run is open. Outcomes (:func:`rq_outcome`):

* ``succeeded`` → ``finished`` (FinishedJobRegistry, result = the run's status dict);
* ``failed``, ``oom`` (the attempt died; snugfit requeues a new attempt as a new RQ job),
  ``lost`` (the lease was reclaimed), ``invalid`` → ``failed`` (FailedJobRegistry, the reason
  as its exception text);
* ``cancelled`` → ``canceled`` (CanceledJobRegistry): the user stopped it, so it is not a
  success, and counting it as ``failed`` would page whoever watches RQ's failure count for a
  run that did nothing wrong. RQ's own ``stopped`` status files the job under *failed*.
* ``skipped`` (the start was refused: stale or duplicate attempt) → ``finished`` with the
  reason as its result, except a start refused because the job was cancelled → ``canceled``,
  and one refused because the record is gone → ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from contextvars import ContextVar
from typing import Any

from rq import SimpleWorker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.utils import now
from rq.worker import WorkerStatus

__all__ = ["NodeRQWorker", "RunTicket", "rq_outcome", "take_ticket"]

log = logging.getLogger("snugfit.worker")

#: How often an open run renews its RQ execution (its TTL is the worker's heartbeat TTL, 420 s
#: for snugfit's jobs without an RQ timeout).
_BEAT_S = 30.0

# The ticket of the execution being performed on this (the RQ loop's) thread.
_OFFERED: ContextVar[RunTicket | None] = ContextVar("snugfit_rq_ticket", default=None)


def take_ticket() -> RunTicket | None:
    """The RQ execution ``run_job`` runs in, now owned by the caller (who must ``end`` it);
    None outside a :class:`NodeRQWorker`."""
    ticket = _OFFERED.get()
    if ticket is None or ticket.taken:
        return None
    ticket.taken = True
    return ticket


def rq_outcome(result: Any) -> tuple[str, str]:
    """The RQ status a run's result dict ends in, and the reason for a non-success."""
    if not isinstance(result, dict):
        return JobStatus.FAILED, f"run ended without an outcome ({result!r:.80})"
    status = str(result.get("status", ""))
    reason = str(result.get("reason") or status)
    if status == "succeeded":
        return JobStatus.FINISHED, ""
    if status == "cancelled":
        return JobStatus.CANCELED, "cancelled by user"
    if status == "skipped":
        if "cancelled" in reason:
            return JobStatus.CANCELED, f"not started: {reason}"
        if reason == "missing":
            return JobStatus.FAILED, "not started: no such snugfit job"
        return JobStatus.FINISHED, ""
    if status == "oom":
        return JobStatus.FAILED, f"CUDA out of memory; snugfit: {result.get('requeue')}"
    if status == "lost":
        return JobStatus.FAILED, "lease lost (reclaimed by the scheduler); outcome discarded"
    return JobStatus.FAILED, reason


class RunTicket:
    """One RQ execution whose run outlives ``perform``: beat it while it runs, end it once."""

    def __init__(self, worker: NodeRQWorker, job: Job, queue: Queue, execution: Execution) -> None:
        self.worker = worker
        self.job = job
        self.queue = queue
        self.execution = execution
        self.taken = False
        self._beat_at = time.monotonic()
        self._ended = False

    def beat(self, force: bool = False) -> None:
        """Renew the execution in the StartedJobRegistry (rate-limited to every ``_BEAT_S``)."""
        if self._ended or (not force and time.monotonic() - self._beat_at < _BEAT_S):
            return
        self._beat_at = time.monotonic()
        w, job = self.worker, self.job
        ttl = int(w.get_heartbeat_ttl(job))
        with w.connection.pipeline() as pipe:
            self.execution.heartbeat(job.started_job_registry, ttl, pipeline=pipe)
            job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
            if not w.torn_down:
                w.heartbeat(pipeline=pipe)
            pipe.execute()

    def close_quietly(self) -> None:
        """Mark it ended without recording anything (RQ recorded the outcome itself)."""
        self._ended = True

    def end(self, result: Any) -> None:
        """Close the execution with the run's outcome; never raises (logged instead)."""
        if self._ended:
            self.worker.ticket_closed(self)
            return
        self._ended = True
        try:
            self.worker.settle(self.job, self.queue, self.execution, result)
        except Exception:
            log.exception("could not record the RQ outcome of %s", self.job.id)
        finally:
            self.worker.ticket_closed(self)


class NodeRQWorker(SimpleWorker):
    """:class:`rq.SimpleWorker` whose jobs end when their snugfit run ends (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[RunTicket] = set()
        self._open_cond = threading.Condition()
        self.torn_down = False
        self._wait_on_teardown = False

    # -- state ----------------------------------------------------------------------------

    def set_state(self, state: str, pipeline: Any = None) -> None:
        # ``_state`` stays the RQ loop's own (an idle loop stops at once on SIGTERM); what
        # others read (``rq info``, rq-dashboard) is busy while any run is open.
        self._state = state
        with self._open_cond:
            shown = WorkerStatus.BUSY if self._open else state
        if self.torn_down:
            return
        conn = pipeline if pipeline is not None else self.connection
        conn.hset(self.key, "state", shown)

    def ticket_closed(self, ticket: RunTicket) -> None:
        with self._open_cond:
            self._open.discard(ticket)
            left = len(self._open)
            self._open_cond.notify_all()
        if not left and not self.torn_down:
            try:
                self.set_state(self._state or WorkerStatus.IDLE)
            except Exception as exc:
                log.warning("could not publish worker state: %s", exc)

    def open_runs(self) -> int:
        with self._open_cond:
            return len(self._open)

    # -- one job ----------------------------------------------------------------------------

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        # Burst and max_jobs runs return once their jobs ended (as the node worker promises);
        # a warm stop (SIGTERM) waits too. A loop that died on a Redis error does not wait: the
        # node worker starts a new loop while the runs go on.
        self._wait_on_teardown = burst or kwargs.get("max_jobs") is not None
        return bool(super().work(burst, *args, **kwargs))

    def prepare_execution(self, job: Job) -> Execution:
        # As RQ's, but the execution is not listed in the worker's own execution index: a
        # hydrated worker (``Worker.all()``) fetches its current job through that index with
        # the pickle serializer, and rq-dashboard 0.9.0 builds its worker list that way even
        # under ``--json``, so a busy snugfit worker turned its workers page into HTTP 500.
        # The StartedJobRegistry entry, the execution hash and the job's ``worker_name`` still
        # say which worker runs what.
        with self.connection.pipeline() as pipe:
            ttl = self.get_heartbeat_ttl(job)
            execution = Execution.create(job, ttl, pipeline=pipe)
            execution.worker_name = self.name
            execution.save(ttl, pipeline=pipe)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            pipe.execute()
        return execution

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        ticket = RunTicket(self, job, queue, execution)
        with self._open_cond:
            self._open.add(ticket)
        token = _OFFERED.set(ticket)
        try:
            self.perform_job(job, queue, execution)
        finally:
            _OFFERED.reset(token)
            if not ticket.taken:
                self.ticket_closed(ticket)
        self.set_state(WorkerStatus.IDLE)

    def _finalize_success(self, job: Job, queue: Queue, execution: Any, return_value: Any) -> None:
        # Called by RQ's perform_job once run_job returned: a run handed to a supervisor ends
        # later (RunTicket.end); anything else ended inside run_job.
        ticket = _OFFERED.get()
        if ticket is not None and ticket.taken:
            return
        self.settle(job, queue, execution, return_value)

    def _finalize_failure(self, job: Job, queue: Queue, execution: Any, exc_info: Any) -> None:
        ticket = _OFFERED.get()
        if ticket is not None and ticket.taken:
            ticket.close_quietly()  # it raised after the hand-over: RQ's failure stands
        super()._finalize_failure(job, queue, execution, exc_info)

    def settle(self, job: Job, queue: Queue, execution: Any, result: Any) -> None:
        """End ``job``'s execution as the run's ``result`` says (:func:`rq_outcome`)."""
        status, reason = rq_outcome(result)
        if status == JobStatus.FINISHED:
            super()._finalize_success(job, queue, execution, result)
            return
        job.ended_at = now()
        if status == JobStatus.CANCELED:
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipeline=pipe, execution=execution)
                pipe.execute()
            job.meta["snugfit_outcome"] = reason
            job.save_meta()
            job.cancel()
            return
        job._status = JobStatus.FAILED
        self.handle_job_failure(
            job,
            queue,
            started_job_registry=queue.started_job_registry,
            exc_string=f"snugfit: {reason}",
            execution=execution,
        )

    # -- counters and teardown --------------------------------------------------------------

    def increment_failed_job_count(self, pipeline: Any = None) -> None:
        if not self.torn_down:  # a run ending after its loop died must not revive the hash
            super().increment_failed_job_count(pipeline)

    def increment_successful_job_count(self, pipeline: Any = None) -> None:
        if not self.torn_down:
            super().increment_successful_job_count(pipeline)

    def increment_total_working_time(self, job_execution_time: Any, pipeline: Any) -> None:
        if not self.torn_down:
            super().increment_total_working_time(job_execution_time, pipeline)

    def teardown(self) -> None:
        stop = self._stop_requested or self._shutdown_requested_date is not None
        if stop or self._wait_on_teardown:
            with self._open_cond:
                while self._open:
                    self._open_cond.wait(1.0)
        self.torn_down = True
        super().teardown()
