"""The ``redis+sentinel://`` URL: parsing, errors that name the fix, and the retry budget."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from scheduler.exceptions import ServiceError
from scheduler.service.store.sentinel import (
    decoded_twin,
    failover_retry,
    is_sentinel_url,
    parse_sentinel_url,
    sentinel_client,
)


def test_parses_hosts_service_db_auth_and_options() -> None:
    u = parse_sentinel_url(
        "redis+sentinel://snug:s%40cret@h1:26379,h2:26380,[::1]:26381/mymaster/3"
        "?sentinel_password=sp&socket_timeout=5"
    )
    assert u.sentinels == [("h1", 26379), ("h2", 26380), ("::1", 26381)]
    assert (u.service, u.db, u.username, u.password, u.ssl) == (
        "mymaster",
        3,
        "snug",
        "s@cret",
        False,
    )
    assert u.options == {"sentinel_password": "sp", "socket_timeout": "5"}
    t = parse_sentinel_url("rediss+sentinel://h1/mymaster")
    assert t.ssl and t.db == 0 and t.sentinels == [("h1", 26379)]
    assert is_sentinel_url("redis+sentinel://h/m") and not is_sentinel_url("redis://h:6379/0")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("redis+sentinel://h1:26379", "master service"),
        ("redis+sentinel://h1:x/m", "bad port"),
        ("redis+sentinel:///m", "no sentinel host"),
        ("redis+sentinel://h1/m/zero", "integer"),
        ("redis+sentinel://h1/m?sentinel_pasword=x", "unknown Sentinel URL option"),
    ],
)
def test_bad_urls_name_the_part_and_the_syntax(url: str, needle: str) -> None:
    with pytest.raises(ServiceError, match=needle):
        parse_sentinel_url(url)


def test_retry_budget_covers_a_failover() -> None:
    r = failover_retry(30.0)
    assert r._retries >= 30  # 50 ms doubling to a 1 s cap: ~35 tries over ~30 s


def test_client_and_its_decoded_twin_discover_through_sentinel() -> None:
    # No connection is made until a command runs: construction alone checks the wiring.
    c = sentinel_client("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/2")
    assert isinstance(c.connection_pool, SentinelConnectionPool)
    twin = decoded_twin(c, decode_responses=True)
    assert twin is not None and isinstance(twin.connection_pool, SentinelConnectionPool)
    assert twin.connection_pool.connection_kwargs["decode_responses"] is True
    assert twin.connection_pool.connection_kwargs["db"] == 2
    assert twin.connection_pool.sentinel_manager is c.connection_pool.sentinel_manager


def test_readme_shows_the_recipe_the_failover_test_runs() -> None:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[4]
    readme = (repo / "README.md").read_text()
    for name in ("redis.conf", "sentinel.conf"):
        text = (repo / "scheduler" / "service" / "store" / "ha" / name).read_text()
        assert f"```\n{text}```" in readme, f"README's {name} snippet differs from ha/{name}"
