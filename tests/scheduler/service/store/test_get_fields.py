"""``RedisStore.get_fields`` (one script call per chunk) reads what one HMGET per job reads,
odd bytes, missing fields and missing records included."""

from __future__ import annotations

from scheduler.service.store import redis_store
from scheduler.service.store.redis_store import RedisStore


def _hmget(store: RedisStore, ids: list[str], fields: list[str]) -> list[list[str | None]]:
    pipe = store.r.pipeline(transaction=False)
    for j in ids:
        pipe.hmget(store.keys.job(j), fields)
    return list(pipe.execute())


def test_get_fields_equals_one_hmget_per_job(store: RedisStore, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store.raw.hset(store.keys.job("a"), mapping={"x": b'\xff\xfeab\x00c"\\/\n', "y": "é€"})
    store.raw.hset(store.keys.job("b"), mapping={"y": "1", "x": ""})
    for k in range(7):
        store.raw.hset(store.keys.job(f"c{k}"), mapping={"x": str(k) * k})
    ids = ["a", "b", "missing", *(f"c{k}" for k in range(7))]
    fields = ["x", "y", "not-a-field"]
    monkeypatch.setattr(redis_store, "_FIELDS_CHUNK", 3)  # several chunks
    assert store.get_fields(ids, fields) == _hmget(store, ids, fields)
    assert store.get_fields(["a"], ["y"]) == [["é€"]]
    assert store.get_fields([], ["x"]) == []
    assert store.get_fields(["a", "b"], []) == [[], []]
