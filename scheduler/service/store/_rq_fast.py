"""Many RQ jobs at once, with one ``rq.Job`` per queue instead of one per job.

RQ builds a ``Job`` object, a dict of its fields and several pipeline calls per job: most of
the leader's enqueue time. Here rq itself enqueues one template job per queue onto a pipeline
that is never sent; its recorded commands are then replayed for each real job with the id,
payload, description and meta swapped in. So every job is written exactly as this rq version
writes it (valid for the worker, ``rq info`` and rq-dashboard; JSON serializer), and if the
recording holds anything the swap does not understand, the caller falls back to rq's own path.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from rq.serializers import JSONSerializer

__all__ = ["replay_commands"]

_TPL_RQ_ID = "snugfit-template-rq-id"
_TPL_JOB = "snugfit-template-job"
_TPL_ATTEMPT = 987654321
_TPL_DESC = "snugfit-template-description"
_TPL_META: dict[str, Any] = {"snugfit_template": True}
_MARKERS = ("snugfit-template", str(_TPL_ATTEMPT))


def _payload(function: str, job_id: str, attempt: int) -> bytes:
    # rq's Job.data: the serialized (func_name, instance, args, kwargs), zlib-compressed on save.
    return zlib.compress(JSONSerializer.dumps((function, None, [job_id, attempt], {})))


def _record(queue: Any, function: str, kwargs: dict[str, Any]) -> list[tuple[Any, ...]] | None:
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


def replay_commands(
    queue: Any,
    function: str,
    kwargs: dict[str, Any],
    jobs: Sequence[tuple[str, str, int, str, dict[str, Any]]],
) -> list[tuple[Any, ...]] | None:
    """Redis commands that enqueue ``jobs`` (rq id, job id, attempt, description, meta) on
    ``queue`` as rq would, or None when the recording is not understood (use rq then)."""
    stack = _record(queue, function, kwargs)
    if not stack:
        return None
    tpl_data = _payload(function, _TPL_JOB, _TPL_ATTEMPT)
    tpl_meta = JSONSerializer.dumps(_TPL_META)
    tpl_key = f"rq:job:{_TPL_RQ_ID}"
    ids = (tpl_key, _TPL_RQ_ID)
    once: list[tuple[Any, ...]] = []
    per_job: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    for cmd in stack:
        strs = [a for a in cmd if isinstance(a, str)]
        blobs = [a for a in cmd if isinstance(a, bytes)]
        if not any(a in ids for a in strs):
            if any(m in a for a in strs for m in _MARKERS):
                return None
            once.append(cmd)
            continue
        for a in strs:
            if any(m in a for m in _MARKERS) and a not in (*ids, _TPL_DESC):
                return None  # the template shows up somewhere the swap does not know
        for b in blobs:
            if b == tpl_data:
                seen.add("data")
            elif b == tpl_meta:
                seen.add("meta")
            elif b"snugfit-template" in b:
                return None
        per_job.append(cmd)
    if seen != {"data", "meta"}:
        return None  # rq stores the payload or the meta differently from what we build
    out = list(once)
    for rq_id, job_id, attempt, desc, meta in jobs:
        swap: dict[Any, Any] = {
            tpl_key: f"rq:job:{rq_id}",
            _TPL_RQ_ID: rq_id,
            _TPL_DESC: desc,
            tpl_data: _payload(function, job_id, attempt),
            tpl_meta: JSONSerializer.dumps(meta),
        }
        for cmd in per_job:
            out.append(tuple(swap.get(a, a) if isinstance(a, str | bytes) else a for a in cmd))
    return out
