"""Many RQ jobs at once: rq records one template job, a Lua script writes the rest.

RQ builds a ``Job`` object, a dict of its fields and several pipeline calls per job: most of
the leader's enqueue time. Here rq itself enqueues one template job onto a pipeline that is never
sent; its recorded commands become a template whose ids, queue, payload, description and meta
are placeholders, and ``scripts/enqueue.lua`` replays it for every real job inside Redis, so
redis-py packs a few values per job instead of every field of every command. Every job is
written exactly as this rq version writes it (valid for the worker, ``rq info`` and
rq-dashboard; JSON serializer); if the recording holds anything the swap does not understand,
:func:`job_template` returns None and the caller uses rq's own path.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat, utcparse

__all__ = ["JobTemplate", "TemplateCache", "by_queue", "job_template", "payload", "script_args"]

_TPL_QUEUE = "snugfit-template-queue"
_TPL_RQ_ID = "snugfit-template-rq-id"
_TPL_JOB = "snugfit-template-job"
_TPL_ATTEMPT = 987654321
_TPL_DESC = "snugfit-template-description"
_TPL_META: dict[str, Any] = {"snugfit_template": True}
_MARKERS = (b"snugfit-template", str(_TPL_ATTEMPT).encode())

# The placeholders enqueue.lua swaps (a NUL first: no value rq writes starts with one).
QUEUE_NAME, QUEUE_KEY = b"\0q", b"\0Q"
JOB_KEY, RQ_ID, DATA, DESCRIPTION, META = b"\0k", b"\0i", b"\0d", b"\0s", b"\0m"
_JOB_SLOTS = (JOB_KEY, RQ_ID, DATA, DESCRIPTION, META)

# (rq id, snugfit job id, attempt, description, meta)
Job = tuple[str, str, int, str, dict[str, Any]]


def payload(function: str, job_id: str, attempt: int) -> bytes:
    """rq's ``Job.data``: the serialized (func_name, instance, args, kwargs), zlib-compressed."""
    return zlib.compress(JSONSerializer.dumps((function, None, [job_id, attempt], {})))


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """The commands rq sends for one queue (``queue_cmds``) and for each job (``job_cmds``)."""

    queue_cmds: tuple[tuple[bytes, ...], ...]
    job_cmds: tuple[tuple[bytes, ...], ...]
    job_key_prefix: bytes  # ``rq:job:``
    queue_key_prefix: str  # ``rq:queue:``
    function: str

    def argv(self, groups: Sequence[tuple[str, Sequence[Job]]]) -> list[bytes | str]:
        """enqueue.lua's ARGV for ``(queue name, jobs)`` groups."""
        out: list[bytes | str] = [
            str(len(self.queue_cmds)),
            str(len(self.job_cmds)),
            self.job_key_prefix,
        ]
        for cmd in (*self.queue_cmds, *self.job_cmds):
            out.append(str(len(cmd)))
            out.extend(cmd)
        for name, jobs in groups:
            out += [name, self.queue_key_prefix + name, str(len(jobs))]
            for rq_id, job_id, attempt, desc, meta in jobs:
                out += [
                    rq_id,
                    payload(self.function, job_id, attempt),
                    desc,
                    JSONSerializer.dumps(meta),
                ]
        return out


def _record(queue: Queue, function: str, kwargs: dict[str, Any]) -> list[tuple[Any, ...]]:
    pipe = queue.connection.pipeline()
    try:
        data = queue.prepare_data(
            function,
            args=[_TPL_JOB, _TPL_ATTEMPT],
            job_id=_TPL_RQ_ID,
            description=_TPL_DESC,
            meta=_TPL_META,
            **kwargs,
        )
        queue.enqueue_many([data], pipeline=pipe)
        return [tuple(args) for args, _ in pipe.command_stack]
    finally:
        pipe.reset()


def job_template(connection: Any, function: str, kwargs: dict[str, Any]) -> JobTemplate | None:
    """Record rq's enqueue of one template job, or None when the recording is not understood.

    Recorded per call: rq's ``created_at``/``enqueued_at`` are the template's, as for a batch.
    """
    queue = Queue(_TPL_QUEUE, connection=connection, serializer=JSONSerializer)
    stack = _record(queue, function, kwargs)
    encode = connection.get_encoder().encode
    tpl_key = f"{_job_key_prefix(queue)}{_TPL_RQ_ID}".encode()
    swap = {
        tpl_key: JOB_KEY,
        _TPL_RQ_ID.encode(): RQ_ID,
        _TPL_DESC.encode(): DESCRIPTION,
        payload(function, _TPL_JOB, _TPL_ATTEMPT): DATA,
        JSONSerializer.dumps(_TPL_META): META,
        _TPL_QUEUE.encode(): QUEUE_NAME,
        queue.key.encode(): QUEUE_KEY,
    }
    queue_cmds: list[tuple[bytes, ...]] = []
    job_cmds: list[tuple[bytes, ...]] = []
    for cmd in stack:
        toks = tuple(swap.get(t, t) for t in map(encode, cmd))
        if any(m in t for t in toks for m in _MARKERS):
            return None  # the template shows up somewhere the swap does not know
        if any(t in _JOB_SLOTS for t in toks):
            job_cmds.append(toks)
        elif QUEUE_NAME in toks or QUEUE_KEY in toks:
            queue_cmds.append(toks)
        else:
            return None  # a command for no queue and no job: replaying it per job is unsafe
    used = {t for cmd in job_cmds for t in cmd}
    if not {JOB_KEY, DATA, META} <= used:
        return None  # rq stores the payload or the meta differently from what we build
    return JobTemplate(
        tuple(queue_cmds),
        tuple(job_cmds),
        _job_key_prefix(queue).encode(),
        queue.key[: -len(_TPL_QUEUE)],
        function,
    )


def _job_key_prefix(queue: Queue) -> str:
    return str(queue.job_class.redis_job_namespace_prefix)


#: The fields of rq's job hash that hold the moment of the enqueue (rq writes ``now()``).
_TIME_FIELDS = (b"created_at", b"enqueued_at")


def _time_slots(tpl: JobTemplate) -> tuple[tuple[int, int], ...] | None:
    """(job command, token) of each of rq's enqueue timestamps in the template, or None when
    they are not one field each of an HSET holding a timestamp rq can parse."""
    slots: list[tuple[int, int]] = []
    for i, cmd in enumerate(tpl.job_cmds):
        if cmd[0] != b"HSET":
            continue
        for k in range(2, len(cmd) - 1, 2):
            if cmd[k] in _TIME_FIELDS:
                try:
                    utcparse(cmd[k + 1].decode())
                except ValueError:
                    return None
                slots.append((i, k + 1))
    return tuple(slots) if len(slots) == len(_TIME_FIELDS) else None


def _stamped(tpl: JobTemplate, slots: tuple[tuple[int, int], ...], stamp: bytes) -> JobTemplate:
    cmds = [list(c) for c in tpl.job_cmds]
    for i, k in slots:
        cmds[i][k] = stamp
    return JobTemplate(
        tpl.queue_cmds,
        tuple(tuple(c) for c in cmds),
        tpl.job_key_prefix,
        tpl.queue_key_prefix,
        tpl.function,
    )


class TemplateCache:
    """:func:`job_template`, recorded once and re-stamped with the enqueue's time per call.

    Recording costs about half a millisecond, a fixed cost on every step of the leader. The
    only values of the recording that change between calls are rq's ``created_at`` and
    ``enqueued_at``; the cache writes ``utcformat(now())`` there, as rq does. It records again
    every ``check_s`` and compares: if anything else has changed, it records on every call
    from then on.
    """

    def __init__(self, function: str, kwargs: dict[str, Any], check_s: float = 1.0) -> None:
        self.function = function
        self.kwargs = kwargs
        self.check_s = check_s
        self._tpl: JobTemplate | None = None
        self._slots: tuple[tuple[int, int], ...] = ()
        self._at = -float("inf")
        self.cacheable = True

    def get(self, connection: Any) -> JobTemplate | None:
        if not self.cacheable:
            return job_template(connection, self.function, self.kwargs)
        t = time.monotonic()
        if self._tpl is None or t - self._at >= self.check_s:
            tpl = job_template(connection, self.function, self.kwargs)
            slots = None if tpl is None else _time_slots(tpl)
            if tpl is None or slots is None:
                self.cacheable = False  # record per call, as without the cache
                return tpl
            if self._tpl is not None and _stamped(tpl, slots, b"") != _stamped(
                self._tpl, self._slots, b""
            ):
                self.cacheable = False  # something else moved between recordings
                return tpl
            self._tpl, self._slots, self._at = tpl, slots, t
            return tpl
        return _stamped(self._tpl, self._slots, utcformat(now()).encode())


def by_queue(items: Sequence[tuple[str, str, int, dict[str, Any]]]) -> dict[str, list[Job]]:
    """RQ jobs ``(node, job id, attempt, meta)`` grouped by their node's queue, in order."""
    from scheduler.service.store.keys import queue_name, rq_job_id

    out: dict[str, list[Job]] = {}
    for node, job_id, attempt, meta in items:
        desc = f"snugfit job {job_id} attempt {attempt}"
        out.setdefault(queue_name(node), []).append(
            # A gang's other nodes carry their own RQ id (scheduler.service._commit).
            (meta.get("rq_job_id") or rq_job_id(job_id, attempt), job_id, attempt, desc, meta)
        )
    return out


def script_args(tpl: JobTemplate, queues: dict[str, list[Job]], chunk: int) -> list[list[Any]]:
    """enqueue.lua's ARGV for every job of ``queues``, about ``chunk`` jobs per call: a step
    places on hundreds of nodes, and no single script should hold Redis for long."""
    calls: list[list[Any]] = []
    groups: list[tuple[str, Sequence[Job]]] = []
    size = 0
    for name, jobs in queues.items():
        for k in range(0, len(jobs), chunk):
            part = jobs[k : k + chunk]
            groups.append((name, part))
            size += len(part)
            if size >= chunk:
                calls.append(tpl.argv(groups))
                groups, size = [], 0
    if groups:
        calls.append(tpl.argv(groups))
    return calls
