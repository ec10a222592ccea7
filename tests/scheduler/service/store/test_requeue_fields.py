"""A requeue may rewrite the retry's layout fields (an OOM retry at a higher tensor parallel
degree), atomically and only when it really requeues; nothing else of the record."""

from __future__ import annotations

import time

import pytest

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec

POOL = Pool.from_dict({"name": "w", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 2}]})


def _running(store: RedisStore, **kw: int) -> None:
    Client(store=store, **kw).submit(spec(0))
    SchedulerService(store, POOL).step()
    store.set_fields("job-0", {"history_request": "{}"})  # a stand-in for history's answer
    assert store.start("job-0", 1, "w", int(time.time() * 1000) + 60_000) == "ok"


def test_the_fields_are_written_with_the_requeue(store: RedisStore) -> None:
    _running(store)
    got = store.requeue(
        "job-0",
        1,
        reason="oom",
        counter="ooms",
        fields={"spec": '{"x":1}', "reserved_gib": "12.5", "history_request": ""},
    )
    assert got == "requeued"
    rec = store.get_job("job-0")
    assert rec is not None and rec["state"] == "pending"
    assert rec["spec"] == '{"x":1}' and rec["reserved_gib"] == "12.5"  # may be lower: new layout
    assert "history_request" not in rec  # "" deletes


def test_a_requeue_that_fails_the_job_writes_nothing(store: RedisStore) -> None:
    _running(store, max_oom_retries=0)
    before = store.get_job("job-0")
    assert before is not None
    got = store.requeue("job-0", 1, reason="oom", counter="ooms", fields={"spec": '{"x":1}'})
    assert got == "failed"
    after = store.get_job("job-0")
    assert after is not None and after["spec"] == before["spec"]
    assert after["history_request"] == "{}"


def test_only_the_layout_fields_may_be_rewritten(store: RedisStore) -> None:
    _running(store)
    with pytest.raises(ValueError, match="requeue cannot write"):
        store.requeue("job-0", 1, reason="oom", counter="ooms", fields={"attempt": "0"})
    rec = store.get_job("job-0")
    assert rec is not None and rec["state"] == "running" and rec["attempt"] == "1"
