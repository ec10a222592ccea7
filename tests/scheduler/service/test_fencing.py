"""Leader fencing across a failover: a lease that vanished (the new master never saw the latest
renewal, or lost the key) stops the leader until it wins the lease again, and an old leader's
token cannot commit once another scheduler holds the lease."""

from __future__ import annotations

import time

import pytest

from scheduler.core.pool import Pool, load_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec


@pytest.fixture
def small() -> Pool:
    return load_pool("datasets/pools/small.toml")


def test_vanished_lease_stops_placing_until_won_again(store: RedisStore, small: Pool) -> None:
    client = Client(store=store)
    a = SchedulerService(store, small, lease_ttl_s=30)
    assert a.step().leader
    store.r.delete(store.keys.leader)  # the failover lost the lease key
    a._renewed_at = 0.0  # due for renewal
    client.submit(spec("after-failover"))
    s = a.step()
    assert not s.leader and s.placed == 0 and not a.is_leader
    assert client.get("job-after-failover").status() == "pending"
    # Next step it competes again, wins the free lease as a new leader (resync) and places.
    s = a.step()
    assert s.leader and s.placed == 1
    assert store.leader() == a.token
    a.assert_consistent()


def test_lease_vanished_mid_step_discards_decisions(store: RedisStore, small: Pool) -> None:
    client = Client(store=store)
    a = SchedulerService(store, small, lease_ttl_s=30)
    assert a.step().leader
    client.submit(spec(0))
    real_tick = a.core.tick

    def tick_then_lose(now: float):  # type: ignore[no-untyped-def]
        out = real_tick(now)
        store.r.delete(store.keys.leader)
        return out

    a.core.tick = tick_then_lose  # type: ignore[method-assign]
    s = a.step()
    assert s.placed == 0 and not a.is_leader
    assert client.counts()["placed"] == 0


def test_old_leader_that_reconnects_cannot_commit(store: RedisStore, small: Pool) -> None:
    client = Client(store=store)
    a = SchedulerService(store, small, lease_ttl_s=30)
    b = SchedulerService(store, small, lease_ttl_s=30)
    assert a.step().leader
    store.r.delete(store.keys.leader)
    assert b.step().leader  # the standby won the lease on the new master
    client.submit(spec(1))
    # `a` has not noticed (within its renewal interval) and tries to commit with its token.
    a._ingest(time.time())
    decisions = [d for d in a.core.tick(time.time()) if d.state == "placed"]
    assert decisions
    placed, conflicts = a._commit(decisions, time.time())
    assert placed == 0 and conflicts == len(decisions)
    assert client.counts()["placed"] == 0
    assert not store.renew_leader(a.token, 30_000)
    assert store.leader() == b.token
