"""``snugfit logs -f``: follow a job's output until the job ends.

A worker keeps the tail of a running job's stdout+stderr in ``P:logs:{id}`` (at most 1 MiB,
rewritten every few seconds and once more before the job's final transition; see
:mod:`workers._supervise`). Following it means reading successive snapshots of that tail and
printing only what is new (:class:`TailDiff`), while watching the job's state: a job that has
not started yet is waited for, a requeued one starts over with its next attempt's output, and
the follow ends when the job reaches a final state. The state is read *before* the log, so once
a final state is seen the log read after it is the complete last one.

Between reads the follower blocks on the placement-log stream (``XREAD BLOCK``), so a state
change wakes it at once instead of after a fixed sleep.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from scheduler.cli._views import LogChunk

__all__ = ["TailDiff", "follow_job", "follow_logs", "print_logs"]

_ANCHOR_CHARS = 4096
_BLOCK_MS = 1000
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})


@dataclass(slots=True)
class TailDiff:
    """What is new in successive snapshots of a log tail that is capped in size.

    While the log is under its cap each snapshot extends the last one. Past the cap the window
    slides: the new snapshot starts somewhere inside the old one, found by the old snapshot's
    last few KiB. When neither holds (more than the cap was written between two reads, or a new
    attempt started a fresh log) the whole snapshot is new and ``skipped`` says text was lost.
    """

    seen: str = ""
    #: how much of the last snapshot must reappear for the window to count as slid
    anchor_chars: int = _ANCHOR_CHARS
    skipped: bool = field(default=False, init=False)

    def update(self, snapshot: str) -> str:
        prev, self.seen, self.skipped = self.seen, snapshot, False
        if snapshot.startswith(prev):
            return snapshot[len(prev) :]
        overlap = _overlap(prev, snapshot, self.anchor_chars)
        if overlap is None:
            self.skipped = bool(prev)
            return snapshot
        return snapshot[overlap:]

    def reset(self) -> None:
        """Start over: the next snapshot is a new log (the job's next attempt)."""
        self.seen = ""


def _overlap(prev: str, snapshot: str, anchor_chars: int) -> int | None:
    """The largest ``p`` with ``snapshot[:p]`` a suffix of ``prev`` (at least one anchor long)."""
    anchor = prev[-anchor_chars:]
    if not anchor:
        return None
    best = None
    start = snapshot.find(anchor)
    while start != -1:
        end = start + len(anchor)
        if prev.endswith(snapshot[:end]):
            best = end
        start = snapshot.find(anchor, start + 1)
    return best


Emit = Callable[[LogChunk], None]


def follow_job(
    store: Any,
    job_id: str,
    emit: Emit,
    *,
    block_ms: int = _BLOCK_MS,
    describe: Callable[[dict[str, str]], str] | None = None,
) -> str:
    """Print ``job_id``'s output as it grows until the job ends; returns its final state.

    ``emit`` gets ``state`` chunks (the job moved to a new state or attempt; ``reason`` from
    ``describe`` when given), ``output`` chunks (new text) and one ``end`` chunk. Raises
    ``KeyError`` when there is no such job.
    """
    diff = TailDiff()
    last_state: str | None = None
    last_attempt: str | None = None
    stale: str | None = None
    cursor = _stream_tail(store)
    while True:
        row = store.get_fields([job_id], ["state", "attempt", "reason", "decision"])[0]
        state, attempt = row[0], row[1]
        if state is None:
            raise KeyError(job_id)
        text = store.logs(job_id)
        att = _int(attempt)
        if attempt != last_attempt and last_attempt is not None:
            # A requeued job: until its next attempt writes, the key still holds the last one's.
            diff.reset()
            stale = text
        if (state != last_state or attempt != last_attempt) and state not in _TERMINAL:
            fields = {"state": state, "attempt": attempt or "", "reason": row[2] or ""}
            fields["decision"] = row[3] or ""
            why = describe(fields) if describe is not None else (row[2] or None)
            emit(LogChunk(id=job_id, kind="state", ts=time.time(), attempt=att, state=state,
                          reason=why))  # fmt: skip
        last_state, last_attempt = state, attempt
        if stale is not None and text == stale:
            new = ""
        else:
            stale = None
            new = diff.update(text)
        if new:
            emit(LogChunk(id=job_id, kind="output", ts=time.time(), attempt=att, text=new,
                          truncated=diff.skipped))  # fmt: skip
        if state in _TERMINAL:
            emit(LogChunk(id=job_id, kind="end", ts=time.time(), attempt=att, state=state,
                          reason=row[2] or None))  # fmt: skip
            return str(state)
        cursor = _wait_for_event(store, cursor, block_ms)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _stream_tail(store: Any) -> str:
    last = store.r.xrevrange(store.keys.events, count=1)
    return str(last[0][0]) if last else "0-0"


def _wait_for_event(store: Any, cursor: str, block_ms: int) -> str:
    """Block until the placement log grows (any job) or ``block_ms`` passes."""
    reply = store.r.xread({store.keys.events: cursor}, count=100, block=block_ms)
    for _stream, entries in reply or ():
        for eid, _fields in entries:
            cursor = str(eid)
    return cursor


# ---------------------------------------------------------------------------------------------
# the command's two modes


def print_logs(client: Any, job_id: str, out: Any) -> None:
    """``snugfit logs ID``: the tail as it is now."""
    from scheduler.cli._views import LogsView

    handle = client.get(job_id)
    text = handle.logs()
    if out.json:
        row = client.store.get_fields([job_id], ["state", "attempt"])[0]
        out.emit_json(LogsView(id=job_id, state=row[0] or "", attempt=_int(row[1]), text=text))
        return
    click.echo(text, nl=False)


def follow_logs(client: Any, job_id: str, out: Any) -> int:
    """``snugfit logs -f ID``: follow until the job ends. The job's output goes to stdout, the
    state lines (``==> job x: pending ...``) to stderr, so ``> file`` keeps only the output.
    Returns the exit status: 0 succeeded, 1 any other end, 130 on Ctrl-C."""
    from scheduler.exceptions import JobNotFoundError

    client.get(job_id)  # a clear error for an unknown id, before any waiting

    def emit(chunk: LogChunk) -> None:
        if out.json:
            out.emit_json(chunk)
        elif chunk.kind == "output":
            if chunk.truncated:
                click.echo("==> (output lost: more than the 1 MiB tail was written)", err=True)
            click.echo(chunk.text or "", nl=False)
        else:
            click.echo(_state_line(chunk), err=True)
        sys.stdout.flush()

    try:
        state = follow_job(
            client.store, job_id, emit, describe=lambda f: _describe(client.store, job_id, f)
        )
    except KeyboardInterrupt:
        click.echo("", err=True)
        return 130
    except BrokenPipeError:
        # `snugfit logs -f ID | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's last flush does not raise again, and stop as a shell would (SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyError:
        raise JobNotFoundError(f"job {job_id!r} disappeared while it was followed") from None
    return 0 if state == "succeeded" else 1


def _state_line(chunk: LogChunk) -> str:
    att = f" (attempt {chunk.attempt})" if chunk.attempt else ""
    verb = "ended" if chunk.kind == "end" else "is"
    why = f": {chunk.reason}" if chunk.reason else ""
    return f"==> job {chunk.id} {verb} {chunk.state}{att}{why}"


def _describe(store: Any, job_id: str, fields: dict[str, str]) -> str:
    """Why a job that has not started waits (Slurm-style Reason), else its stored reason. The
    leader stores no decision for a job it keeps pending, so its options are priced now,
    read-only, as ``explain`` does."""
    state = fields.get("state")
    if state not in ("pending", "placed"):
        return fields.get("reason", "")
    if state == "placed":
        return "waiting for its node's worker to start it"
    import json

    from scheduler.cli.render import pending_reason
    from scheduler.core.decision import Decision
    from scheduler.exceptions import SchedulerError

    decision = None
    try:
        raw = json.loads(fields.get("decision") or "null")
        decision = Decision.from_dict(raw) if isinstance(raw, dict) else None
    except (ValueError, SchedulerError, KeyError, TypeError):
        decision = None
    if decision is None and state == "pending":
        from scheduler.dashboard.pending import derived_pending

        decision = derived_pending(store, job_id, fields.get("reason", ""))
        if decision is None and fields.get("reason"):
            return str(fields["reason"])  # held or dependent: the stored reason says why
    return pending_reason(decision, state)
