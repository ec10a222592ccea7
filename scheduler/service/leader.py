"""The scheduler service: one leader places pending jobs and enqueues them on their node's queue.

Each :meth:`SchedulerService.step`:

1. **Lease.** The leader holds ``P:leader`` (SET NX PX, renewed by a Lua compare-and-extend).
   A standby retries every step and takes over when the lease lapses (``lease_ttl_s``, 5 s by
   default). On takeover it writes the pool into Redis (unless the same pool is there), rebuilds
   its pool state from ``P:allocs`` and re-enqueues placed jobs whose RQ job is missing (a
   leader that died between commit and enqueue loses nothing).
2. **Reclaim.** Running jobs whose lease expired (their worker stopped heart-beating) release
   their capacity and go back to pending, or fail once ``max_retries`` are used (Lua, fenced by
   the attempt number, so a worker that was only slow cannot finish over a newer attempt).
   Placed jobs that no worker started within ``placement_lease_s`` (a node with no live
   worker) are requeued the same way.
   **Nodes.** Nodes whose worker heartbeat is older than ``node_stale_s`` (15 s), or that an
   operator cordoned or is draining, take no new placements; jobs placed on a down or draining
   node that no worker started move back to pending without using up a retry
   (:mod:`scheduler.service.nodes`).
3. **Sync.** When ``P:capver`` moved (workers finished jobs, another scheduler placed some),
   the in-memory :class:`~scheduler.core.state.PoolState` is brought in line with ``P:allocs``.
4. **Ingest** a window of ``P:pending`` (oldest first, ``window`` jobs, so memory stays flat
   with 100,000 queued), validating each record
   (:class:`~scheduler.service.store.records.RequestRecord`);
   malformed or hostile records are rejected and logged, never raised. A recurring job is
   re-predicted from its measured history at its first ingest
   (:class:`~scheduler.service.history_feed.HistoryFeed`, read from ``P:history`` as workers
   append to it); the record's ``method`` becomes ``history:<n> runs`` and the adjusted request
   is stored as ``history_request`` for its later attempts. Steps are as small as
   the arrivals since the last one (a low rate gets a step per job) and batch up to ``window``
   under a burst; ``step_target_s`` optionally caps a step to that much measured work.
5. **Decide** with :class:`~scheduler.core.loop.SchedulerCore` and the configured policy.
6. **Commit** placements in chunks, one Lua script per chunk, fenced by the lease token. It
   checks every job (capacity in ``P:gpu`` with the chunk's earlier jobs counted, state,
   attempt, and that every figure is well formed) before it writes anything, so a chunk never
   stops halfway. A refused commit (capacity taken by someone else) rolls the placement back
   in memory and resyncs; a malformed one rejects that job with its reason. So no GPU is
   double-booked, even by two schedulers running by mistake, and no job holds capacity
   without its scheduler knowing.
7. **Enqueue** committed jobs on ``snugfit:node:{node}`` (RQ, JSON serializer, function
   ``workers.execute.run_job``, args ``[job id, attempt]``) with the decision in ``job.meta``.
8. **Log** placed/rejected/reclaimed/requeued events to ``P:events`` and a JSON-lines file.
   The job's ``decision`` is stored compactly (``Decision.to_dict(compact=True)``: every
   option's numbers as columns, repeating ones as runs, reasons as codes where the row words
   them), which ``snugfit explain`` reads back losslessly.

**Retrain** (optional, ``retrain=RetrainPolicy(...)``): after the history poll, every N new
real history rows or T hours the leader starts a retraining *process* and only polls it
afterwards (:mod:`scheduler.service.retrain`); the placement loop never trains.

The lease and takeover live in :mod:`scheduler.service._takeover`, reclaim, node checks and
capacity sync in :mod:`scheduler.service._housekeeping`, what follows a commit in
:mod:`scheduler.service._settle`; :class:`SchedulerService` mixes them in.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.gpus import GPU_NAMES
from scheduler.core.decision import Decision, Option
from scheduler.core.fence import tick_fenced
from scheduler.core.pool import MIB_PER_GIB, Pool
from scheduler.core.state import PoolState
from scheduler.exceptions import ServiceError
from scheduler.policies.base import Policy
from scheduler.policies.registry import get_policy
from scheduler.service._commit import (
    COMMIT_CHUNK,
    build_commit,
    commit_chunks,
    placement_record,
)
from scheduler.service._intake import InvalidRecord, RequestDecoder, decode_engine
from scheduler.service._settle import _Settle
from scheduler.service._state import _Known
from scheduler.service._takeover import _Leadership, _new_token
from scheduler.service.deployments import expire_due
from scheduler.service.events import EventLog, event
from scheduler.service.history_feed import HistoryFeed
from scheduler.service.nodes import DEFAULT_NODE_STALE_S, NodeWatch
from scheduler.service.retrain import Retrainer, RetrainPolicy
from scheduler.service.store.protocol import Commit, Store
from scheduler.service.store.records import PlacementRecord, dumps

__all__ = ["SchedulerService", "StepStats"]

log = logging.getLogger("snugfit.scheduler")

#: Longest wait between retries while Redis is unreachable.
_MAX_BACKOFF_S = 2.0


@dataclass(slots=True)
class StepStats:
    leader: bool = False
    ingested: int = 0
    placed: int = 0
    rejected: int = 0
    invalid: int = 0
    conflicts: int = 0
    reclaimed: int = 0
    pending_in_window: int = 0
    moved: int = 0  # placed jobs moved off down or draining nodes (no retry used)


class SchedulerService(_Leadership, _Settle):
    """The leader loop around :class:`~scheduler.core.loop.SchedulerCore` (see the module doc)."""

    def __init__(
        self,
        store: Store,
        pool: Pool,
        policy: str | Policy = "rightsize",
        *,
        token: str | None = None,
        leader_election: bool = True,
        lease_ttl_s: float = 5.0,
        window: int = 5000,
        poll_s: float = 0.05,
        log_path: str | Path | None = None,
        simulated: bool = False,
        telemetry: Any | None = None,
        placement_lease_s: float = 120.0,
        step_target_s: float | None = None,
        node_stale_s: float | None = DEFAULT_NODE_STALE_S,
        node_check_s: float = 1.0,
        retrain: RetrainPolicy | None = None,
    ) -> None:
        from scheduler.core.loop import SchedulerCore

        self.store = store
        self.pool = pool
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.token = token or _new_token()
        self.leader_election = leader_election
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        self.window = int(window)
        self.poll_s = float(poll_s)
        self.events = EventLog(store, log_path)
        self.simulated = simulated
        # service.telemetry.Telemetry (or anything with observe_placement_latency(seconds)):
        # fed submit -> commit latency per committed placement.
        self.telemetry = telemetry
        # A placed job whose node never starts it (no worker, a wedged one) holds capacity for
        # nothing; after this long it is requeued (counted as a lost lease).
        self.placement_lease_s = float(placement_lease_s)
        # job -> (attempt, placed_at), in placement order, so the check reads only the oldest.
        self._placed: dict[str, tuple[int, float]] = {}
        self._placement_checked_at = 0.0
        self._expiry_checked_at = 0.0
        # Optional adaptive batch: a step ingests about step_target_s worth of new jobs (from the
        # measured seconds per job), bounding a step's latency under a burst. Off by default:
        # on the 8,192-GPU benchmark pool a 0.25 s budget halved throughput (317 vs 611 jobs/s)
        # because each step has fixed costs; a low arrival rate gets small steps anyway.
        self.step_target_s = None if step_target_s is None else float(step_target_s)
        self._s_per_job: float | None = None
        # Node liveness: worker records are re-read every node_check_s; staleness is judged
        # every step from them. None turns liveness off (cordon/drain still apply).
        self.node_watch = NodeWatch(store, pool, stale_s=node_stale_s, check_s=node_check_s)
        self._recovered_at = -math.inf
        self._recover_cursor = 0
        self.core = SchedulerCore(pool.state(), self.policy)
        # Pending records decoded once per distinct request text (a burst of identical jobs).
        self._decode = RequestDecoder(pool)
        self.is_leader = False
        self._capver = -1
        self._known: dict[str, _Known] = {}
        self._renewed_at = 0.0
        self.totals = StepStats()
        # Simulated rows count only for a simulated leader (see HistoryFeed).
        self.history = HistoryFeed(store, include_simulated=simulated)
        # Periodic retraining of the learned tier in another process (None: off).
        self.retrainer = Retrainer(retrain) if retrain is not None else None

    # -- one iteration ------------------------------------------------------------------------

    def step(self) -> StepStats:
        """One iteration (see the module doc), with the cyclic garbage collector paused: a
        step holds thousands of decisions and option tables at once, and every collection
        inside it scanned them all. What a step frees is freed by reference counting as
        always; cycles wait for the collector's next run, after the step."""
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._step()
        finally:
            if paused:
                gc.enable()

    def _step(self) -> StepStats:
        stats = StepStats()
        if not self._lead():
            return stats
        stats.leader = True
        t0 = time.perf_counter()
        now = time.time()
        stats.reclaimed = self._reclaim(now) + self._reclaim_unstarted(now)
        if now - self._expiry_checked_at >= 1.0:  # deployments whose duration_s ran out
            self._expiry_checked_at = now
            expire_due(self.store, now)
        stats.moved = self._check_nodes(now)
        self._check_enqueued(now)
        self._sync()
        self.history.poll()
        self._retrain_tick(now)
        stats.ingested, stats.invalid = self._ingest(now)
        # Down, cordoned, draining and refusing nodes (MIG layout mismatch, no MPS daemon)
        # get nothing new.
        decisions = tick_fenced(self.core, self.node_watch.fence, now)
        if not self._still_leader():
            # The lease lapsed while we decided (a long tick): another scheduler may lead now,
            # so nothing decided here is committed; the fenced commit would refuse it anyway.
            self.is_leader = False
            self._reset()
            stats.leader = False
            return stats
        placed = [d for d in decisions if d.state == "placed"]
        rejected = [d for d in decisions if d.state == "rejected"]
        stats.placed, stats.conflicts = self._commit(placed, now)
        stats.rejected = self._reject(rejected)
        stats.pending_in_window = self.core.n_pending
        if stats.ingested >= 8:
            per = (time.perf_counter() - t0) / stats.ingested
            self._s_per_job = per if self._s_per_job is None else 0.7 * self._s_per_job + 0.3 * per
        for name in (
            "placed",
            "rejected",
            "invalid",
            "conflicts",
            "reclaimed",
            "ingested",
            "moved",
        ):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(stats, name))
        return stats

    def run(self, stop: threading.Event | None = None, max_steps: int | None = None) -> None:
        """Step until ``stop`` is set (or ``max_steps``); sleeps on the wake-up list when idle.

        A failed step (Redis restarting or unreachable, a bug) never ends the loop: the leader
        drops its in-memory view, waits with exponential backoff (``poll_s`` doubling to
        ``_MAX_BACKOFF_S``) and, once a step succeeds again, takes over afresh from Redis
        (capacity, allocations, placed jobs whose RQ job is missing). Only a
        :class:`ServiceError` (a configuration conflict such as another pool) ends it.
        """
        stop = stop or threading.Event()
        steps = 0
        failures = 0
        try:
            while not stop.is_set() and (max_steps is None or steps < max_steps):
                steps += 1
                try:
                    s = self.step()
                    if not s.leader:
                        stop.wait(min(1.0, self.lease_ttl_ms / 4000))
                    elif s.placed == 0 and s.ingested == 0 and s.reclaimed == 0 and not s.moved:
                        # Inside the guard: the wake-up BLPOP is the first command to meet a
                        # Redis restart while the scheduler is idle.
                        self.store.wait_wakeup(self.poll_s)
                except ServiceError:
                    raise
                except Exception as exc:
                    failures += 1
                    if failures == 1:
                        log.exception("scheduler step failed; retrying with backoff")
                    else:
                        log.warning("scheduler step failed again (%d): %s", failures, exc)
                    self._step_failed()
                    stop.wait(min(_MAX_BACKOFF_S, self.poll_s * 2 ** min(failures, 10)))
                    continue
                if failures:
                    log.warning("scheduler recovered after %d failed steps", failures)
                    failures = 0
        finally:
            self.resign()

    def _step_failed(self) -> None:
        """Forget the in-memory view: what Redis holds is re-read at the next takeover."""
        self.is_leader = False
        self._renewed_at = 0.0
        self._reset()

    # -- ingest -------------------------------------------------------------------------------

    def _ingest(self, now: float) -> tuple[int, int]:
        window = self.store.pending_window(self.window)
        wset = set(window)
        for jid in list(self._known):
            if jid not in wset:
                self._known.pop(jid)
                self.core.cancel(jid)
        new = [j for j in window if j not in self._known and j not in self.core.running]
        if not new:
            return 0, 0
        new = new[: self.batch_size()]
        fields = ["state", "attempt", "submitted_at", "reserved_gib", "request", "engine"]
        fields.append("history_request")
        # The spec only where history may answer from it (read, encoded and parsed per job).
        with_spec = self.history.reads_spec
        if with_spec:
            fields.append("spec")
        rows = self.store.get_fields(new, fields)
        events: list[dict[str, Any]] = []
        n_ok = n_bad = 0
        for jid, row in zip(new, rows, strict=True):
            st, attempt, submitted, reserved, raw, engine_raw, hist_raw = row[:7]
            spec = row[7] if with_spec else None
            try:
                req = self._decode(jid, st, attempt, submitted, reserved, raw)
                engine = decode_engine(engine_raw)
                req, method = self.history.answer(jid, req, attempt, spec, hist_raw)
            except InvalidRecord as exc:
                n_bad += 1
                got = self.store.reject(jid, str(exc), "null")
                kind = "rejected" if got == "rejected" else "invalid"
                events.append(event(kind, jid, reason=str(exc), policy=self.policy.name.value))
                log.warning("rejected job %r: %s", jid[:80], exc)
                continue
            self._known[jid] = _Known(int(attempt or 0), req.submit_time_s, engine, method)
            self.core.submit(req)
            n_ok += 1
        self.events.emit(events)
        return n_ok, n_bad

    def batch_size(self) -> int:
        """New jobs the next step ingests: ``window``, or ``step_target_s`` worth (64 ..)."""
        if self.step_target_s is None or self._s_per_job is None:
            return self.window
        return max(64, min(self.window, int(self.step_target_s / max(self._s_per_job, 1e-6))))

    def _commit(self, placed: list[Decision], now: float) -> tuple[int, int]:
        if not placed:
            return 0, 0
        policy = self.policy.name.value
        commits: list[Commit] = []
        records: list[PlacementRecord] = []

        def build(start: int) -> list[Commit]:
            for d in placed[start : start + COMMIT_CHUNK]:
                known = self._known[d.job_id]
                rec = placement_record(
                    self.pool,
                    d,
                    known.attempt + 1,
                    now=now,
                    policy=policy,
                    simulated=self.simulated,
                    engine=known.engine,
                )
                raw = d.compact_json()
                decision_json = dumps(d.to_dict(compact=True)) if raw is None else raw.decode()
                commits.append(build_commit(rec, known.attempt, decision_json))
                records.append(rec)
            return commits[start:]

        totals = [0, 0]
        replies: list[Callable[[], object]] = []
        unsent: list[Exception] = []

        def read() -> None:
            # Each owed reply is read (its connection goes back to the pool) and the first
            # failure kept, to be raised once every chunk is settled, as the enqueue raised it.
            for reply in replies:
                try:
                    reply()
                except Exception as exc:
                    unsent.append(exc)
            replies.clear()

        def settle(start: int, answers: list[str]) -> None:
            # Each chunk as its answers arrive (Redis runs the next chunk meanwhile); what was
            # sent and answered is settled even when a later chunk fails. The previous chunk's
            # RQ jobs and events are read before this chunk's are sent (in order, see
            # _after_commit); Redis has run them by then, behind the chunk being committed.
            end = start + len(answers)
            got = self._after_commit(
                placed[start:end], records[start:end], commits[start:end], answers, replies, read
            )
            totals[0] += got[0]
            totals[1] += got[1]

        _, failed = commit_chunks(
            self.store,
            len(placed),
            build,
            self.token,
            self._still_leader,
            fenced=self.leader_election,
            settle=settle,
        )
        read()
        if unsent:
            raise unsent[0]
        if failed is not None:
            raise failed
        return totals[0], totals[1]

    # -- views --------------------------------------------------------------------------------

    def free_gib_by_type(self) -> dict[str, float]:
        out: dict[str, float] = {}
        free = self.core.state.free_mib
        for t, name in enumerate(GPU_NAMES):
            m = self.pool.gpu_type == t
            if m.any():
                out[name] = float(free[m].sum()) / MIB_PER_GIB
        return out

    def assert_consistent(self) -> PoolState:
        """Rebuild the pool state from Redis alone; PoolError if anything is over-committed."""
        state = self.pool.state()
        for jid, raw in self.store.allocations().items():
            state.allocate(Option.from_dict(json.loads(raw)["option"]), jid)
        state.assert_consistent()
        return state
