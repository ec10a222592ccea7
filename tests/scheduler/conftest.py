"""Fixtures for the scheduler tests."""

from __future__ import annotations

import pytest

from scheduler.service.store.redis_store import MemoryStore, RedisStore, Store


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each service test runs against the in-memory store and a real, empty Redis."""
    if request.param == "memory":
        return MemoryStore()
    import redis

    return RedisStore(redis.Redis.from_url(request.getfixturevalue("redis_url")))
