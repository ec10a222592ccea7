"""Running a node worker's RQ queue in the test process, to the end (RQ's burst mode)."""

from __future__ import annotations

from rq import SimpleWorker
from rq.serializers import JSONSerializer

from workers.worker import NodeWorker


def drain(w: NodeWorker) -> None:
    """Run every job on ``w``'s queue in this process with ``w``'s context, then return."""
    from workers.execute import set_context

    set_context(w.ctx)
    try:
        SimpleWorker(
            [w.queue],
            connection=w.store.raw,
            serializer=JSONSerializer,
            job_class=w.rq_worker().job_class,
        ).work(burst=True)
    finally:
        set_context(None)
