"""The store's RESP packer writes exactly redis-py's bytes and refuses what redis-py refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from redis.connection import PythonRespSerializer
from redis.exceptions import DataError

from scheduler.service.store._resp import FastRespPacker
from scheduler.service.store.redis_store import RedisStore


def _redis_py(*args: Any) -> bytes:
    from redis._parsers.encoders import Encoder

    return b"".join(
        PythonRespSerializer(6000, Encoder("utf-8", "replace", False).encode).pack(*args)
    )


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "abc", 0, "P", "job-ü", 7, 1.5, -3, 1e308, b"\x00raw"),
        ("SCRIPT LOAD", "return 1"),
        (b"CLIENT SETNAME", "x"),
        ("SET", "k", "v" * 20_000),  # past redis-py's buffer cutoff
        ("HSET", "k", bytearray(b"ab"), memoryview(b"cd"), np.float64(0.25)),
        ("EVALSHA", *[str(i) for i in range(5000)]),
        ("EVALSHA", "abc", 0, *[f"{i}" * 9000 for i in range(40)]),  # several pieces
    ],
)
def test_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    assert b"".join(FastRespPacker("utf-8", "replace").pack(*args)) == _redis_py(*args)


def test_a_large_command_comes_in_bounded_pieces() -> None:
    from scheduler.service.store._resp import _CHUNK_BYTES

    args = ("EVALSHA", "abc", 0, *["d" * 9000] * 40)
    pieces = FastRespPacker().pack(*args)
    assert len(pieces) > 1 and b"".join(pieces) == _redis_py(*args)
    assert all(len(p) < _CHUNK_BYTES + 9100 for p in pieces)


def test_refuses_what_redis_py_refuses() -> None:
    for bad in (True, None, object(), np.int64(3)):
        with pytest.raises(DataError):
            FastRespPacker().pack("SET", "k", bad)


def test_store_round_trips_through_the_packer(store: RedisStore) -> None:
    store.set_fields("j1", {"a": "ü" * 3, "b": "1"})
    assert store.get_fields(["j1"], ["a", "b", "c"]) == [["ü" * 3, "1", None]]


def _record(job_id: str) -> dict[str, str]:
    return {"id": job_id, "submitted_at": "1.0", "updated_at": "1.0", "attempt": "0"}


def test_add_loads_the_script_when_the_server_lost_it(store: RedisStore) -> None:
    """The direct EVALSHA of a one-job add falls back to redis-py's call, which loads it."""
    store.r.script_flush()
    assert store.add_new_jobs([_record("a")]) == ([True], [])
    assert store.get_fields(["a"], ["state"]) == [["pending"]]


def test_add_retries_the_ordinary_way_when_the_connection_fails(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    conn = store.r.connection_pool.get_connection()
    store.r.connection_pool.release(conn)
    real = type(conn).send_packed_command
    calls = []

    def broken_once(self: Any, *args: Any, **kw: Any) -> None:
        calls.append(args[0])
        if len(calls) == 1:
            raise redis.ConnectionError("reset by peer")
        real(self, *args, **kw)

    monkeypatch.setattr(type(conn), "send_packed_command", broken_once)
    assert store.add_new_jobs([_record("b")]) == ([True], [])
    assert len(calls) >= 2 and store.job_ids() == ["b"]
    # An error reply raises, as it does from redis-py's own call.
    with pytest.raises(redis.ResponseError):
        store.add_new_jobs([{"id": "c", "submitted_at": "not a number"}])


def test_calls_sent_together_answer_in_order(store: RedisStore) -> None:
    """calls_send: scripts and plain commands on one connection, replies read later, in
    order; a script the server lost is loaded; an error reply raises once all are read."""
    import redis

    from scheduler.service.store._resp import calls_send

    echo = store.r.register_script("return ARGV[1]")
    read = calls_send(store.r, [(echo, ["a"]), (None, ["SET", "k", "v"]), (echo, ["b"])])
    assert read() == ["a", "OK", "b"]
    store.r.script_flush()
    assert calls_send(store.r, [(echo, ["c"]), (None, ["GET", "k"])])() == ["c", "v"]
    read = calls_send(store.r, [(None, ["INCR", "k"]), (None, ["SET", "k2", "w"])])
    with pytest.raises(redis.ResponseError):
        read()
    assert store.r.get("k2") == "w"  # the call after the error ran, and its reply was read
    assert store.r.ping()


def test_a_packed_hset_is_what_the_packer_writes() -> None:
    from scheduler.service.store._resp import packed_hset

    for value in ("{}", "ü" * 3000, "x" * 70_000):
        got = packed_hset("snugfit:job:j-ü", "decision", value, "utf-8", "replace")
        want = FastRespPacker("utf-8", "replace").pack("HSET", "snugfit:job:j-ü", "decision", value)
        assert got.resp == b"".join(want) and got.args[3] == value
