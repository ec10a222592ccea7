"""The scheduling loop shared by the live service and the discrete-event simulator.

The core owns the queue, the running set and the pool state; a policy decides; a clock says
when. The service drives it with a :class:`~scheduler.core.clock.SystemClock` and Redis at the
edges, the simulator with a :class:`~scheduler.core.clock.VirtualClock` and an event heap.
Neither has a branch here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from scheduler.core.clock import Clock, SystemClock
from scheduler.core.decide import rejected_decision
from scheduler.core.decision import Decision
from scheduler.core.options import OptionBatch, option_table
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest, RunningJob
from scheduler.core.state import PoolState
from scheduler.exceptions import PlacementError, SchedulerError

if TYPE_CHECKING:
    # The one interface the loop calls; the policies themselves depend on the core.
    from scheduler.policies.base import Policy

__all__ = ["BatchMaker", "CoreCounters", "SchedulerCore"]

#: How the core gets the (default-knob) OptionBatch of a list of jobs on a pool.
BatchMaker = Callable[[Sequence[PlacementRequest], Pool], OptionBatch]


@dataclass(slots=True)
class CoreCounters:
    submitted: int = 0
    placed: int = 0
    rejected: int = 0
    finished: int = 0
    cancelled: int = 0
    oom_kills: int = 0
    ticks: int = 0
    placement_seconds: float = field(default=0.0)


class SchedulerCore:
    """Queue + running set + pool state, advanced one tick at a time.

    Queue order is priority (higher first), then submit time, then arrival. Each tick the policy
    sees the whole queue; placed jobs move to ``running``, rejected ones leave, the rest wait.
    A job that fits nowhere even on an empty pool is rejected by the core itself, whatever the
    policy, so it never sits in the queue forever.
    """

    def __init__(
        self,
        pool_state: PoolState,
        policy: Policy,
        clock: Clock | None = None,
        *,
        batches: BatchMaker = OptionBatch,
    ) -> None:
        """``batches`` builds the OptionBatch of each tick's new jobs (default: a fresh one);
        a replay that knows every job in advance passes rows of one batch built up front."""
        self.state = pool_state
        self.policy = policy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._batches = batches
        self._pending: dict[str, tuple[tuple[float, float, int], PlacementRequest]] = {}
        self._checked: set[str] = set()
        self._seq = itertools.count()
        self.running: dict[str, RunningJob] = {}
        self.counters = CoreCounters()

    # -- queue --------------------------------------------------------------------------------

    @property
    def pending(self) -> list[PlacementRequest]:
        return [r for _, r in sorted(self._pending.values(), key=lambda kv: kv[0])]

    @property
    def n_pending(self) -> int:
        """``len(self.pending)`` without sorting the queue."""
        return len(self._pending)

    def submit(self, request: PlacementRequest) -> None:
        jid = request.job_id
        if jid in self._pending or jid in self.running:
            raise SchedulerError(
                f"job {jid!r} is already {'queued' if jid in self._pending else 'running'}; "
                "job ids must be unique"
            )
        key = (-float(request.priority), request.submit_time_s, next(self._seq))
        self._pending[jid] = (key, request)
        self.counters.submitted += 1

    def cancel(self, job_id: str) -> bool:
        """Drop a queued job or stop a running one; False if the core does not know it."""
        if self._pending.pop(job_id, None) is not None:
            self._checked.discard(job_id)
            self.counters.cancelled += 1
            return True
        if job_id in self.running:
            self.running.pop(job_id)
            self.state.release(job_id)
            self.counters.cancelled += 1
            return True
        return False

    # -- ticks --------------------------------------------------------------------------------

    def tick(self, now_s: float | None = None) -> list[Decision]:
        """Run the policy over the queue; returns every decision, rejections included."""
        import time

        now = self.clock.now() if now_s is None else float(now_s)
        t0 = time.perf_counter()
        decisions: list[Decision] = []
        pool = self.state.pool
        new = [req for jid, (_, req) in self._pending.items() if jid not in self._checked]
        batch = self._batches(new, pool) if new else None
        for i, req in enumerate(new):
            self._checked.add(req.job_id)
            if batch is not None and batch.fits_empty_any(i):
                continue
            table = option_table(req, self.state)
            decisions.append(rejected_decision(table, policy=str(self.policy.name), now_s=now))
            self._drop(req.job_id)
            self.counters.rejected += 1
        queue = self.pending
        if queue:
            running = list(self.running.values())
            # When the queue is just this tick's new jobs (all fit somewhere), their batch is
            # the policy's too: the openb replay submits one pod per tick, and building the
            # batch was half its time.
            same = batch is not None and len(new) == len(queue)
            given = batch if same and all(a is b for a, b in zip(new, queue, strict=True)) else None
            for d in self.policy.schedule(queue, self.state, now, running, given):
                self._apply(d, now)
                decisions.append(d)
        self.counters.ticks += 1
        self.counters.placement_seconds += time.perf_counter() - t0
        return decisions

    def _apply(self, d: Decision, now: float) -> None:
        entry = self._pending.get(d.job_id)
        if entry is None:
            raise SchedulerError(
                f"policy {self.policy.name} decided for {d.job_id!r}, which is not queued"
            )
        req = entry[1]
        if d.state == "placed":
            opt = d.chosen_option
            if opt is None:
                raise SchedulerError(
                    f"policy {self.policy.name} placed {d.job_id!r} without a chosen option"
                )
            if d.job_id not in self.state:
                # Policies are meant to commit as they go; commit here for any that do not.
                self.state.allocate(opt, d.job_id)
            runtime = opt.runtime_s if opt.runtime_s is not None else math.inf
            user = req.user_runtime_estimate_s
            self.running[d.job_id] = RunningJob(
                job_id=d.job_id,
                option=opt,
                start_s=now,
                predicted_end_s=now + runtime,
                user_end_s=None if user is None else now + user,
                request=req,
            )
            self._drop(d.job_id)
            self.counters.placed += 1
        elif d.state == "rejected":
            self._drop(d.job_id)
            self.counters.rejected += 1

    def _drop(self, job_id: str) -> None:
        self._pending.pop(job_id, None)
        self._checked.discard(job_id)

    # -- job ends -----------------------------------------------------------------------------

    def finish(self, job_id: str) -> RunningJob:
        """A running job ended (success or failure): its capacity is released."""
        try:
            job = self.running.pop(job_id)
        except KeyError:
            raise PlacementError(f"job {job_id!r} is not running; cannot finish it") from None
        self.state.release(job_id)
        self.counters.finished += 1
        return job

    def oom(
        self, job_id: str, new_reservation_gib: float, request: PlacementRequest | None = None
    ) -> PlacementRequest:
        """A running job was OOM-killed: release it and requeue it with a larger reservation,
        or as ``request`` (the job at a higher tensor parallel degree, whose per-GPU figures
        are its own: ``scheduler.core.escalation``).

        The job keeps its place in the queue (its original submit time), so an OOM costs it a
        restart, not its turn.
        """
        job = self.running.get(job_id)
        if job is None or job.request is None:
            raise PlacementError(f"job {job_id!r} is not running; cannot requeue it after OOM")
        if request is not None and request.job_id != job_id:
            raise PlacementError(
                f"job {job_id!r}: the retry's request is for {request.job_id!r}; pass its own"
            )
        if request is None and not new_reservation_gib > job.option.reserved_gib:
            raise PlacementError(
                f"job {job_id!r}: the new reservation after an OOM must exceed the old one "
                f"({job.option.reserved_gib:.2f} GiB); got {new_reservation_gib:.2f} GiB"
            )
        self.running.pop(job_id)
        self.state.release(job_id)
        self.counters.oom_kills += 1
        if request is None:
            req = job.request.with_reservation(new_reservation_gib)
        else:
            req = replace(request, submit_time_s=job.request.submit_time_s)
        key = (-float(req.priority), req.submit_time_s, next(self._seq))
        self._pending[job_id] = (key, req)
        return req

    def running_jobs(self) -> Sequence[RunningJob]:
        return tuple(self.running.values())
