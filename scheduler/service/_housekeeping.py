"""Housekeeping each step before ingest: reclaim jobs whose run lease or placement lease ran
out, move jobs off down or draining nodes, and keep the in-memory pool state in line with
``P:allocs``."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from pydantic import ValidationError

from scheduler.core.decision import Option
from scheduler.core.requests import RunningJob
from scheduler.exceptions import PlacementError
from scheduler.service._state import _ServiceState
from scheduler.service.events import event
from scheduler.service.nodes import move_off, requeue_dead_gangs
from scheduler.service.store.records import PlacementRecord

__all__: list[str] = []

log = logging.getLogger("snugfit.scheduler")


class _Housekeeping(_ServiceState):
    """Reclaim, node checks and capacity sync of :class:`SchedulerService` (step 2 and 3)."""

    # -- reclaim ------------------------------------------------------------------------------

    def _reclaim(self, now: float) -> int:
        now_ms = int(now * 1000)
        expired = self.store.expired_leases(now_ms)
        if not expired:
            return 0
        rows = self.store.get_fields(expired, ["attempt", "worker", "placement"])
        events = []
        n = 0
        for jid, (attempt, worker, _) in zip(expired, rows, strict=True):
            if attempt is None:
                continue
            got = self.store.requeue(
                jid,
                int(attempt),
                reason=f"worker {worker} stopped renewing the job's lease",
                counter="lost",
                expired_before_ms=now_ms,
            )
            got_events = self._reclaimed(
                jid, int(attempt), got, f"lease expired (worker {worker})", "lease lost"
            )
            n += bool(got_events)
            events += got_events
        self.events.emit(events)
        return n

    def _reclaimed(
        self, jid: str, attempt: int, got: str, reason: str, requeued: str, **where: Any
    ) -> list[dict[str, Any]]:
        """The events of a reclaim whose requeue answered ``got``; none if nothing was freed."""
        if got not in ("requeued", "failed", "cancelled"):
            return []
        out = [
            event(
                "reclaimed",
                jid,
                attempt=attempt,
                **where,
                reason=f"{reason}; capacity released, job {got}",
                policy=self.policy.name.value,
            )
        ]
        if got == "requeued":
            out.append(event("requeued", jid, attempt=attempt, reason=requeued))
        return out

    def _reclaim_unstarted(self, now: float) -> int:
        """Requeue placed jobs that no worker started within ``placement_lease_s``."""
        if now - self._placement_checked_at < min(5.0, self.placement_lease_s / 4):
            return 0
        self._placement_checked_at = now
        cutoff = now - self.placement_lease_s
        old: list[tuple[str, int]] = []
        for jid, (attempt, placed_at) in self._placed.items():
            if placed_at > cutoff:
                break
            old.append((jid, attempt))
        if not old:
            return 0
        for jid, _ in old:
            del self._placed[jid]
        rows = self.store.get_fields([j for j, _ in old], ["state", "attempt", "placement"])
        events = []
        n = 0
        for (jid, attempt), (st, att, raw) in zip(old, rows, strict=True):
            if att is None or int(att) != attempt:
                continue  # finished or re-placed
            if st == "running":
                # A gang runs once one rank starts; the others must follow within the lease.
                got_events = self._reclaim_partial_gang(jid, attempt, raw)
                n += bool(got_events)
                events += got_events
                continue
            if st != "placed":
                continue  # its run lease covers it now, or it ended
            try:
                node = PlacementRecord.model_validate_json(raw or "").node
            except ValidationError:
                node = "?"
            reason = (
                f"placed on node {node} {self.placement_lease_s:g} s ago but never started "
                f"(is `snugfit worker --node {node}` running?)"
            )
            got = self.store.requeue(
                jid, attempt, reason=reason, counter="lost", from_states="placed"
            )
            got_events = self._reclaimed(
                jid, attempt, got, reason, "placement never started", node=node
            )
            n += bool(got_events)
            events += got_events
        self.events.emit(events)
        return n

    def _reclaim_partial_gang(self, jid: str, attempt: int, raw: str | None) -> list[Any]:
        """Requeue a running multi-node gang some of whose ranks never started (their node's
        worker is gone): the started ranks would wait at the rendezvous for ever. Their next
        heartbeat answers "lost", so their workers stop them."""
        try:
            p = PlacementRecord.model_validate_json(raw or "")
        except ValidationError:
            return []
        if p.gang is None:
            return []
        fields = [f"rank:{attempt}:{r.node_rank}" for r in p.gang]
        held = self.store.get_fields([jid], fields)[0]
        missing = [r for r, w in zip(p.gang, held, strict=True) if w is None]
        if not missing:
            return []
        nodes = ", ".join(r.node for r in missing)
        ranks = ", ".join(str(r.node_rank) for r in missing)
        reason = (
            f"gang rank {ranks} on node {nodes} never started {self.placement_lease_s:g} s "
            f"after placement (is `snugfit worker --node {missing[0].node}` running?); every "
            "rank stopped, gang requeued"
        )
        got = self.store.requeue(jid, attempt, reason=reason, counter="lost")
        return self._reclaimed(jid, attempt, got, reason, "gang never fully started", node=nodes)

    # -- nodes --------------------------------------------------------------------------------

    def _check_nodes(self, now: float) -> int:
        """Fence down / cordoned nodes for this step's tick; move unstarted jobs off down /
        draining ones (no retry used), and requeue running gangs with a rank on a down one.
        Returns how many jobs were moved."""
        due = self.node_watch.check(now)
        if not due:
            return 0
        statuses, policy = self.node_watch.statuses, self.policy.name.value
        moved, events = move_off(self.store, due, statuses, policy)
        for jid in moved:
            self._placed.pop(jid, None)
        _, gang_events = requeue_dead_gangs(self.store, due, statuses, policy)
        self.events.emit(events + gang_events)
        return len(moved)

    # -- retraining ---------------------------------------------------------------------------

    def _retrain_tick(self, now: float) -> None:
        """Start a due retrain in another process, or log one that ended; never trains here."""
        if self.retrainer is None:
            return
        try:
            events = self.retrainer.tick(now, self.history.real_rows)
        except OSError as exc:  # cannot write its files or start the process: say so, go on
            log.warning("retraining not started: %s", exc)
            return
        self.events.emit(events)

    # -- capacity sync ------------------------------------------------------------------------

    def _sync(self, force: bool = False) -> None:
        version = self.store.capacity_version()
        if version == self._capver and not force:
            return
        ids = set(self.store.alloc_ids())
        state = self.core.state
        mine = set(state.jobs)
        for jid in mine - ids:
            if jid in self.core.running:
                self.core.finish(jid)
            else:
                state.release(jid)
        new = sorted(ids - mine)
        if new:
            now = time.time()
            for jid, raw in self.store.allocations(new).items():
                try:
                    opt = Option.from_dict(json.loads(raw)["option"])
                    state.allocate(opt, jid)
                except (PlacementError, ValueError, KeyError, TypeError) as exc:
                    log.warning("allocation of %s does not fit our view (%s); rebuilding", jid, exc)
                    self._rebuild()
                    break
                runtime = opt.runtime_s if opt.runtime_s is not None else math.inf
                self.core.running[jid] = RunningJob(jid, opt, now, now + runtime)
        self._capver = version

    def _rebuild(self) -> None:
        from scheduler.core.loop import SchedulerCore

        state = self.pool.state()
        running: dict[str, RunningJob] = {}
        now = time.time()
        for jid, raw in self.store.allocations().items():
            try:
                opt = Option.from_dict(json.loads(raw)["option"])
                state.allocate(opt, jid)
            except Exception as exc:
                log.error("ignoring unreadable allocation of %s: %s", jid, exc)
                continue
            runtime = opt.runtime_s if opt.runtime_s is not None else math.inf
            running[jid] = RunningJob(jid, opt, now, now + runtime)
        self.core = SchedulerCore(state, self.policy)
        self.core.running.update(running)
        self._known.clear()
