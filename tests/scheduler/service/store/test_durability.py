"""SNUGFIT_DURABILITY=replica: a submit no replica confirmed is refused, and re-submitting the
same ids is idempotent. (The real-replica case is the failover fault test.)"""

from __future__ import annotations

import time

import pytest
import redis

from scheduler.exceptions import ServiceError
from scheduler.service.client import Client
from scheduler.service.store.durability import Durability, NotDurableError
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec


def test_default_is_local_and_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNUGFIT_DURABILITY", raising=False)
    assert Durability.from_env().replicas == 0
    monkeypatch.setenv("SNUGFIT_DURABILITY", "replica")
    assert Durability.from_env() == Durability(replicas=1, timeout_ms=2000)
    monkeypatch.setenv("SNUGFIT_DURABILITY", "quorum")
    with pytest.raises(ServiceError, match="SNUGFIT_DURABILITY must be one of local, replica"):
        Durability.from_env()
    monkeypatch.setenv("SNUGFIT_DURABILITY", "replica")
    monkeypatch.setenv("SNUGFIT_DURABILITY_TIMEOUT_MS", "soon")
    with pytest.raises(ServiceError, match="positive integer"):
        Durability.from_env()


def test_no_replica_means_not_submitted_and_resubmit_is_idempotent(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNUGFIT_DURABILITY", "replica")
    monkeypatch.setenv("SNUGFIT_DURABILITY_TIMEOUT_MS", "100")
    store = RedisStore(redis.Redis.from_url(redis_url))
    if int(store.r.info("replication")["connected_slaves"]) > 0:
        pytest.skip("the test server has a replica")
    client = Client(store=store)
    t0 = time.monotonic()
    with pytest.raises(NotDurableError, match="count as not submitted") as err:
        client.submit_many([spec("d0"), spec("d1")])
    assert time.monotonic() - t0 >= 0.09  # it did wait for the replica
    assert err.value.job_ids == ["job-d0", "job-d1"]
    # The record is on the master (not rolled back); re-submitting the same ids keeps one copy.
    monkeypatch.setenv("SNUGFIT_DURABILITY", "local")
    again = Client(store=RedisStore(redis.Redis.from_url(redis_url)))
    assert [h.id for h in again.submit_many([spec("d0"), spec("d1")])] == ["job-d0", "job-d1"]
    assert sorted(store.job_ids()) == ["job-d0", "job-d1"]
