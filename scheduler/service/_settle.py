"""After the commit: enqueue and log the placements that committed, undo the in-memory view
of those that did not, and record rejections."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.core.decision import Decision
from scheduler.service._commit import placed_event, rank_items
from scheduler.service._state import _ServiceState
from scheduler.service.events import event
from scheduler.service.store.protocol import Commit
from scheduler.service.store.records import PlacementRecord, dumps

__all__: list[str] = []

log = logging.getLogger("snugfit.scheduler")


class _Settle(_ServiceState):
    """What :class:`SchedulerService` does with commit results and rejections (steps 6-8)."""

    def _after_commit(
        self,
        placed: Sequence[Decision],
        records: Sequence[PlacementRecord],
        commits: Sequence[Commit],
        results: Sequence[str],
        replies: list[Callable[[], object]],
        read_owed: Callable[[], None],
    ) -> tuple[int, int]:
        """Enqueue and log what committed, undo our view of what did not: (placed, conflicts).

        Called once per commit chunk, in chunk order. ``bad:`` (a malformed value in the
        job's placement) rejects the job with that reason; ``err:`` (capacity or the job
        taken meanwhile) leaves it pending for the next step. The RQ jobs and the events are
        sent without waiting, the committed jobs' decisions first (a store with
        ``commit_send`` leaves them to this); their reads go on ``replies``. ``read_owed()``
        runs first, just before the sends: it reads the earlier chunks' replies, so each
        chunk's writes reach Redis only once the earlier chunk's have run. (Each send has a
        connection of its own, and Redis serves waiting connections in no set order: two
        chunks' writes in flight at once could land out of order, in an RQ queue or the
        event stream.)
        """
        items: list[tuple[str, str, int, dict[str, Any]]] = []
        decisions: list[tuple[str, str]] = []
        events: list[dict[str, Any]] = []
        versions: list[int] = []
        conflicts = 0
        committed_at = time.time()
        for d, rec, c, res in zip(placed, records, commits, results, strict=True):
            seen = self._known.pop(d.job_id, None)
            if not res.startswith("ok"):
                conflicts += 1
                # Someone else took the capacity or the job, or the value was malformed: undo
                # our view and resync next step.
                if d.job_id in self.core.running:
                    self.core.finish(d.job_id)
                self._capver = -1
                log.info("commit of %s refused: %s", d.job_id, res)
                if res.startswith("bad:"):
                    events += self._reject_bad(d.job_id, res[4:], c.decision_json)
                continue
            versions.append(int(res.split(":", 1)[1]))
            self._placed.pop(d.job_id, None)
            self._placed[d.job_id] = (rec.attempt, rec.placed_at)
            if self.telemetry is not None and seen is not None:
                self.telemetry.observe_placement_latency(committed_at - seen.submitted_at)
            items += rank_items(rec)
            decisions.append((d.job_id, c.decision_json))
            ev = placed_event(rec)
            if seen is not None and seen.method is not None:
                ev["method"] = seen.method
            events.append(ev)
        # Chunk by chunk, in order: the versions of the whole step run on from _capver exactly
        # when each chunk's run on from the one before.
        if self._capver >= 0 and versions == list(
            range(self._capver + 1, self._capver + 1 + len(versions))
        ):
            self._capver += len(versions)
        else:
            self._capver = -1
        read_owed()
        if items:
            send = getattr(self.store, "enqueue_send", None)
            if send is None:
                self.store.enqueue(items)  # its commit() wrote the decisions
            else:
                # commit_send leaves each committed job's decision to be written here, before
                # the job's RQ job and never for a job whose commit was refused.
                replies.append(send(items, decisions=decisions))
        replies.append(self.events.emit_send(events))
        return len(items), conflicts

    def _reject_bad(self, job_id: str, why: str, decision_json: str) -> list[dict[str, Any]]:
        reason = f"malformed placement refused at commit: {why}"
        if self.store.reject(job_id, reason, decision_json) != "rejected":
            return []
        return [event("rejected", job_id, reason=reason, policy=self.policy.name.value)]

    def _reject(self, rejected: list[Decision]) -> int:
        events = []
        for d in rejected:
            self._known.pop(d.job_id, None)
            got = self.store.reject(d.job_id, d.reason, dumps(d.to_dict(compact=True)))
            if got == "rejected":
                events.append(
                    event("rejected", d.job_id, reason=d.reason, policy=self.policy.name.value)
                )
        self.events.emit(events)
        return len(events)
