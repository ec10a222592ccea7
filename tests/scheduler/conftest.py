"""Fixtures for the scheduler tests."""

from __future__ import annotations

import pytest

from scheduler.service.store import RedisStore, Store


@pytest.fixture
def store(redis_url: str) -> Store:
    """A store on a real, empty Redis database: the service is only ever tested on Redis."""
    import redis

    return RedisStore(redis.Redis.from_url(redis_url))
