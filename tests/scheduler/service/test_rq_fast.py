"""Replayed RQ enqueues are byte-for-byte what rq writes, bar ids and timestamps."""

from __future__ import annotations

from typing import Any

from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from scheduler.service.store._rq_fast import replay_commands
from scheduler.service.store.keys import JOB_FUNCTION, queue_name, rq_job_id
from scheduler.service.store.redis_store import _RQ_JOB_KWARGS, RedisStore

_TIMES = {b"created_at", b"enqueued_at"}


def _hash(store: RedisStore, rq_id: str) -> dict[bytes, bytes]:
    return {k: v for k, v in store.raw.hgetall(f"rq:job:{rq_id}").items() if k not in _TIMES}


def test_replayed_jobs_equal_rq_jobs(store: RedisStore) -> None:
    q = Queue(queue_name("n1"), connection=store.raw, serializer=JSONSerializer)
    meta: dict[str, Any] = {"snugfit_job": "a", "attempt": 1, "gpus": [0, 1], "reason": "x y"}
    # rq's own path for job "a", the replay for job "b" with the same fields.
    q.enqueue_many(
        [
            q.prepare_data(
                JOB_FUNCTION,
                args=["a", 1],
                job_id="a-1",
                description="snugfit job a attempt 1",
                meta=meta,
                **_RQ_JOB_KWARGS,
            )
        ]
    )
    cmds = replay_commands(
        q, JOB_FUNCTION, _RQ_JOB_KWARGS, [("b-1", "b", 1, "snugfit job b attempt 1", meta)]
    )
    assert cmds is not None
    pipe = store.raw.pipeline()
    for c in cmds:
        pipe.execute_command(*c)
    pipe.execute()
    a, b = _hash(store, "a-1"), _hash(store, "b-1")
    assert set(a) == set(b)
    for k in a:
        if k not in (b"data", b"description"):
            assert a[k] == b[k], k
    job = Job.fetch("b-1", connection=store.raw, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.kwargs) == (JOB_FUNCTION, ["b", 1], {})
    assert job.meta == meta and job.origin == q.name and job.get_status() == "queued"
    assert job.enqueued_at is not None and job.timeout == -1
    assert q.job_ids == ["a-1", "b-1"]
    assert store.raw.sismember("rq:queues", q.key)


def test_store_enqueue_writes_valid_rq_jobs_on_each_node(store: RedisStore) -> None:
    items = [(f"n{i % 3}", f"job-{i}", 1, {"snugfit_job": f"job-{i}"}) for i in range(9)]
    store.enqueue(items)
    for node, jid, attempt, meta in items:
        assert store.enqueued(node, jid, attempt)
        q = Queue(queue_name(node), connection=store.raw, serializer=JSONSerializer)
        rq_id = rq_job_id(jid, attempt)
        job = Job.fetch(rq_id, connection=store.raw, serializer=JSONSerializer)
        assert job.args == [jid, attempt] and job.meta == meta and job.id in q.job_ids
