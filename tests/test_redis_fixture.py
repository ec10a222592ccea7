"""The test infrastructure itself: every test gets a real, empty Redis database."""

from __future__ import annotations


def test_redis_is_real_and_empty(redis_client) -> None:  # type: ignore[no-untyped-def]
    assert redis_client.ping()
    assert redis_client.dbsize() == 0
    redis_client.set("k", "v")
    assert redis_client.get("k") == b"v"


def test_next_test_starts_empty_again(redis_client) -> None:  # type: ignore[no-untyped-def]
    assert redis_client.dbsize() == 0
