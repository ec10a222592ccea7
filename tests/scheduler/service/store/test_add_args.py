"""add.lua rebuilds every record exactly from the coded arguments (_add_args), whatever
repeats or does not repeat from job to job."""

from __future__ import annotations

import json

import pytest

from scheduler.service.store._add_args import add_args
from scheduler.service.store.redis_store import RedisStore


def _rec(jid: str, ts: str, **extra: str) -> dict[str, str]:
    q = json.dumps(jid)
    return {
        "id": jid,
        "submitted_at": ts,
        "updated_at": ts,
        "spec": '{"id":' + q + ',"model":"m","task":"inference","batch_size":8' + "," * 40 + "}",
        "predictions": ('{"A":{"id":' + q + ',"v":1.5},"B":{"id":' + q + ',"v":2.5}}') * 2,
        "method": "analytical",
        **extra,
    }


def _check(store: RedisStore, records: list[dict[str, str]]) -> None:
    assert store.add_jobs(records) == [True] * len(records)
    for rec in records:
        assert store.get_job(rec["id"]) == {**rec, "state": "pending"}


def test_a_sweep_is_three_arguments_a_job(store: RedisStore) -> None:
    records = [_rec(f"j{i}", f"{100 + i}.5", user="u") for i in range(200)]
    # A job after the first (names, literals, templates): its id, submitted_at and code.
    assert len(add_args(records)) - len(add_args(records[:199])) == 3
    assert add_args(records[:1])[3] == "Nissvvvv"  # a template only for a value that repeats
    assert add_args(records)[-1] == "Risspp=="
    _check(store, records)


def test_values_that_change_and_repeat_irregularly(store: RedisStore) -> None:
    records = [
        _rec("a", "1.0"),
        _rec("b", "2.0", user="x"),  # new field names
        _rec("c", "2.0", user="x"),  # submitted_at as the previous job's
        {**_rec("d", "3.0", user="x"), "spec": "short"},  # a template that stops repeating
        {**_rec("e", "4.0", user="x"), "method": "e"},  # a value equal to the id
        _rec("f", "5.0", user="x"),  # the old template again, after a literal
        {**_rec("g", "6.0", user="x"), "predictions": "p" * 100},  # long, no id in it
        {**_rec("h", "7.0", user="x"), "predictions": "p" * 100},
        _rec('q"uote', "8.0", user="x"),  # an id that JSON escapes
        _rec("ü-1", "9.0", user="9.0"),  # non-ASCII; a value equal to submitted_at
        _rec("last", "10.0"),  # the first names again
    ]
    _check(store, records)


def test_an_id_twice_in_a_batch_is_added_once(store: RedisStore) -> None:
    first, again = _rec("dup", "1.0"), _rec("dup", "2.0", user="other")
    assert store.add_new_jobs([first, _rec("x", "1.5"), again]) == ([True, True, False], [])
    assert store.get_job("dup") == {**first, "state": "pending"}
    assert store.add_jobs([_rec("dup", "3.0"), _rec("y", "3.0")]) == [False, True]


def test_existing_ids_are_answered_before_anything_is_written(store: RedisStore) -> None:
    _check(store, [_rec("old", "1.0")])
    added, stored = store.add_new_jobs([_rec("new", "2.0"), _rec("old", "2.0")])
    assert added is None and stored == [None, _rec("old", "1.0")["spec"]]
    assert store.get_job("new") is None


def test_held_and_dependent_jobs_keep_their_path(store: RedisStore) -> None:
    parent = _rec("p", "1.0")
    held = _rec("h", "2.0", hold="1")
    child = _rec("c", "3.0", deps='["p"]')
    orphan = _rec("o", "4.0", deps='["nobody"]')
    from scheduler.exceptions import UnknownDependencyError

    with pytest.raises(UnknownDependencyError, match="nobody"):
        store.add_jobs([parent, held, child, orphan])
    assert store.r.zscore(store.keys.pending, "p") is not None
    assert store.r.zscore(store.keys.pending, "h") is None
    assert store.r.zscore(store.keys.pending, "c") is None
    assert store.get_job("c")["deps_left"] == "1"  # type: ignore[index]
    assert store.get_job("o") is None
    assert set(store.job_ids("pending")) == {"p", "h", "c"}
    assert store.job_ids() == ["p", "h", "c"]
