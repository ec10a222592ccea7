"""Replayed RQ enqueues (enqueue.lua) are byte-for-byte what rq writes, bar ids and times."""

from __future__ import annotations

from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from scheduler.service.store import _rq_fast
from scheduler.service.store._rq_fast import job_template
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
                job_id=rq_job_id("a", 1),
                description="snugfit job a attempt 1",
                meta=meta,
                **_RQ_JOB_KWARGS,
            )
        ]
    )
    assert job_template(store.raw, JOB_FUNCTION, _RQ_JOB_KWARGS) is not None
    store.enqueue([("n1", "b", 1, meta)])
    a, b = _hash(store, rq_job_id("a", 1)), _hash(store, rq_job_id("b", 1))
    assert set(a) == set(b)
    for k in a:
        if k not in (b"data", b"description"):
            assert a[k] == b[k], k
    job = Job.fetch(rq_job_id("b", 1), connection=store.raw, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.kwargs) == (JOB_FUNCTION, ["b", 1], {})
    assert job.meta == meta and job.origin == q.name and job.get_status() == "queued"
    assert job.enqueued_at is not None and job.timeout == -1
    assert job.description == "snugfit job b attempt 1"
    assert q.job_ids == [rq_job_id("a", 1), rq_job_id("b", 1)]
    assert store.raw.sismember("rq:queues", q.key)
    assert not any(b"snugfit-template" in k for k in store.raw.keys("*"))


@pytest.mark.parametrize("template", [True, False], ids=["lua", "rq-fallback"])
def test_store_enqueue_writes_valid_rq_jobs_on_each_node(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, template: bool
) -> None:
    if not template:  # a recording the swap does not understand: rq's own path
        monkeypatch.setattr(_rq_fast, "job_template", lambda *a, **k: None)
    # More jobs than one script call takes, over several queues.
    items = [(f"n{i % 3}", f"job-{i}", 1 + i % 2, {"snugfit_job": f"job-{i}"}) for i in range(2500)]
    store.enqueue(items)
    for node, jid, attempt, meta in items[::97]:
        assert store.enqueued(node, jid, attempt)
        q = Queue(queue_name(node), connection=store.raw, serializer=JSONSerializer)
        rq_id = rq_job_id(jid, attempt)
        job = Job.fetch(rq_id, connection=store.raw, serializer=JSONSerializer)
        assert job.args == [jid, attempt] and job.meta == meta and job.id in q.job_ids
    for n in range(3):
        q = Queue(queue_name(f"n{n}"), connection=store.raw, serializer=JSONSerializer)
        assert q.count == sum(1 for it in items if it[0] == f"n{n}")


def test_a_cached_template_stamps_each_enqueue_with_its_own_time(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rq.utils import utcparse

    cache = _rq_fast.TemplateCache(JOB_FUNCTION, _RQ_JOB_KWARGS, check_s=3600.0)
    first = cache.get(store.raw)
    assert first is not None and cache.cacheable
    recorded = []
    monkeypatch.setattr(_rq_fast, "job_template", lambda *a, **k: recorded.append(1))
    # The next enqueue happens a minute later (the clock the cache stamps with, not a sleep).
    from datetime import timedelta

    later = _rq_fast.now() + timedelta(minutes=1)
    monkeypatch.setattr(_rq_fast, "now", lambda: later)
    again = cache.get(store.raw)
    assert recorded == [] and again is not None  # not recorded again
    times = [
        utcparse(cmd[k + 1].decode())
        for t in (first, again)
        for cmd in t.job_cmds
        if cmd[0] == b"HSET"
        for k in range(2, len(cmd) - 1, 2)
        if cmd[k] in (b"created_at", b"enqueued_at")
    ]
    assert len(times) == 4 and min(times[2:]) > max(times[:2])  # stamped now, not then
    # Every other token is the recording's own.
    assert _rq_fast._stamped(first, cache._slots, b"") == _rq_fast._stamped(
        again, cache._slots, b""
    )


def test_the_template_cache_stops_caching_when_the_recording_changes(store: RedisStore) -> None:
    cache = _rq_fast.TemplateCache(JOB_FUNCTION, _RQ_JOB_KWARGS, check_s=0.0)
    assert cache.get(store.raw) is not None and cache.cacheable
    cache.kwargs = dict(_RQ_JOB_KWARGS, result_ttl=7)  # as if rq wrote something else now
    assert cache.get(store.raw) is not None and not cache.cacheable
