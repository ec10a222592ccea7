"""Leadership: the ``P:leader`` lease (acquire, renew, resign) and takeover, which writes the
pool into Redis, rebuilds the in-memory state and re-enqueues placed jobs whose RQ job is
missing."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

from scheduler.exceptions import ServiceError
from scheduler.service._housekeeping import _Housekeeping
from scheduler.service.store.records import current_placements, dumps

__all__: list[str] = []

log = logging.getLogger("snugfit.scheduler")

#: Up to this many jobs in ``placed``, every step checks that each has its RQ job; above it,
#: each check takes the next slice of this many (a cursor over the set), so a backlog of placed
#: jobs that no worker has started costs every step the same.
_RECOVER_SLICE = 256
#: Slices per second at most, once the backlog is that large.
_RECOVER_SLICES_PER_S = 10.0


def _new_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Leadership(_Housekeeping):
    """Lease and takeover of :class:`SchedulerService` (step 1); takeover resyncs capacity."""

    def _lead(self) -> bool:
        if not self.leader_election:
            if not self.is_leader:
                self._take_over()
            return True
        now = time.monotonic()
        # Renew at a quarter of the TTL: a standby sees a lapse within one TTL of the death.
        if self.is_leader and now - self._renewed_at < self.lease_ttl_ms / 4000:
            return True
        # A leader only renews: if its lease vanished (a failover lost the key) it stands down
        # and, on the next step, competes for the lease and resyncs like any new leader.
        if self.is_leader:
            got = self.store.renew_leader(self.token, self.lease_ttl_ms)
        else:
            got = self.store.acquire_leader(self.token, self.lease_ttl_ms)
        self._renewed_at = now
        if got and not self.is_leader:
            log.info("scheduler %s is the leader", self.token)
            self._take_over()
        elif not got and self.is_leader:
            log.warning("scheduler %s lost the lease; standing by", self.token)
            self.is_leader = False
            self._reset()
        return got

    def _still_leader(self) -> bool:
        if not self.leader_election:
            return True
        ok = self.store.renew_leader(self.token, self.lease_ttl_ms)
        if ok:
            self._renewed_at = time.monotonic()
        return ok

    def _reset(self) -> None:
        from scheduler.core.loop import SchedulerCore

        self.core = SchedulerCore(self.pool.state(), self.policy)
        self._known.clear()
        self._placed.clear()
        self._capver = -1

    def _take_over(self) -> None:
        from scheduler.service._commit import capacity_rows

        config = self.pool.to_dict()
        gpus, nodes = capacity_rows(self.pool)
        got = self.store.init_pool(dumps(config), self.pool.name, gpus, nodes)
        if got == "busy":
            stored = self.store.pool_config()
            raise ServiceError(
                f"Redis holds capacity for another pool ({(stored or {}).get('name')!r}) with jobs "
                f"still on it; run the scheduler with that pool file, or let those jobs finish "
                f"before switching to {self.pool.name!r}"
            )
        self._reset()
        self.is_leader = True
        self._sync(force=True)
        self._recover_placed()

    def _recover_placed(self, rebuild: bool = True, ids: list[str] | None = None) -> int:
        """Enqueue placed jobs whose RQ job is missing: the old leader died between commit and
        enqueue, an enqueue failed on a connection error, or a Redis restart lost the RQ write.
        ``ids`` limits the check to those jobs (default: every placed job). ``rebuild`` also
        refills the placement-lease index (at takeover). Returns how many."""
        if ids is None:
            ids = self.store.job_ids("placed")
        if not rebuild:
            # Only the jobs whose RQ job the server did not find get the full check below.
            ids = self.store.maybe_unenqueued(ids)
        if not ids:
            return 0
        found = current_placements(self.store, ids)
        if rebuild:
            for jid, p in sorted(found, key=lambda jp: jp[1].placed_at):
                self._placed[jid] = (p.attempt, p.placed_at)
        have = self.store.enqueued_many([(jid, p.attempt) for jid, p in found])
        items = []
        for (jid, p), ok in zip(found, have, strict=True):
            if ok:
                continue
            meta: dict[str, Any] = {"snugfit_job": jid, "recovered": True}
            if p.engine is not None:
                meta["engine"] = p.engine
            if p.gang is None:
                items.append((p.node, jid, p.attempt, meta))
                continue
            # A gang whose node-0 RQ job is gone: every node's (re-enqueueing is idempotent).
            for r in p.gang:
                m = dict(meta, node_rank=r.node_rank, rq_job_id=r.rq_job_id)
                items.append((r.node, jid, p.attempt, m))
        if items:
            log.warning("re-enqueueing %d placed jobs that had no RQ job", len(items))
            self.store.enqueue(items)
        return len(items)

    def _check_enqueued(self, now: float) -> None:
        """Every step while few jobs wait in ``placed`` (a worker starts them in milliseconds);
        a slice at a time, a few times a second, when many do, so a backlog does not slow
        every step."""
        if self.store.count("placed") <= _RECOVER_SLICE:
            self._recover_placed(rebuild=False)
            return
        if now - self._recovered_at < 1.0 / _RECOVER_SLICES_PER_S:
            return
        self._recovered_at = now
        self._recover_cursor, ids = self.store.scan_state(
            "placed", self._recover_cursor, _RECOVER_SLICE
        )
        self._recover_placed(rebuild=False, ids=ids)

    def resign(self) -> None:
        """Give up the lease (best effort: with Redis unreachable the lease simply lapses)."""
        was = self.is_leader
        self.is_leader = False
        if self.leader_election and was:
            try:
                self.store.release_leader(self.token)
            except Exception as exc:
                log.warning("could not release the leader lease (%s); it lapses by itself", exc)
