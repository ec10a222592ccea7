"""The placement log's events, shared by the leader and the workers.

Each event goes to the store's stream (``P:events``, what ``snugfit log -f`` tails) and, when
the emitter has a path, to a JSON-lines file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.service.store.protocol import Store
from scheduler.service.store.records import dumps

__all__ = ["EventLog", "event"]

log = logging.getLogger("snugfit.events")


class EventLog:
    """Placement-log events: to the store's stream and, when ``path`` is set, a JSONL file."""

    def __init__(self, store: Store, path: str | Path | None = None) -> None:
        self.store = store
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def emit(self, events: Sequence[Mapping[str, Any]]) -> None:
        self.emit_send(events)()

    def emit_send(self, events: Sequence[Mapping[str, Any]]) -> Callable[[], None]:
        """:meth:`emit` with the stream's answer read later: the events are sent (and written
        to the file) now, and the returned call (once) waits for the stream's answer. As in
        :meth:`emit`, a stream that cannot be written is logged, never raised."""
        if not events:
            return _nothing
        send = getattr(self.store, "emit_send", None)
        read: Callable[[], object] = _nothing
        try:
            if send is None:
                self.store.emit(events)
            else:
                read = send(events)
        except Exception as exc:
            log.warning("could not write %d events to the stream: %s", len(events), exc)
        if self.path is not None:
            text = "".join(dumps(dict(e)) + "\n" for e in events)
            with self._lock, self.path.open("a", encoding="utf-8") as fh:
                fh.write(text)
        n = len(events)

        def answer() -> None:
            try:
                read()
            except Exception as exc:
                log.warning("could not write %d events to the stream: %s", n, exc)

        return answer


def _nothing() -> None:
    return None


def event(kind: str, job_id: str | None, **fields: Any) -> dict[str, Any]:
    """One event: ``ts`` (Unix seconds), ``event`` (a kind from ``EVENT_KINDS``), ``job_id``."""
    out: dict[str, Any] = {"ts": time.time(), "event": kind, "job_id": job_id}
    out.update(fields)
    return out
