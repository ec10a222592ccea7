"""The commit path on real Redis: one record per placement, atomic chunks, hardened Lua."""

from __future__ import annotations

import json
import time

import pytest

from scheduler.core.pool import Pool, load_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import rq_job_id
from scheduler.service.store.protocol import Commit
from scheduler.service.store.records import dumps
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.scheduler.service._ledger import assert_ledger_matches_allocations

WHOLE = {"name": "w", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 4}]}
SHARED_NODE = {"name": "n", "gpu": "H100-80GB", "count": 2, "mode": "shared", "max_shared_jobs": 4}
SHARED = {"name": "s", "nodes": [SHARED_NODE]}


@pytest.fixture
def small() -> Pool:
    return load_pool("datasets/pools/small.toml")


def _holders_without_rq_job(store: RedisStore) -> list[str]:
    out = []
    for jid, raw in store.allocations().items():
        attempt = int(json.loads(raw)["attempt"])
        if not store.raw.exists(f"rq:job:{rq_job_id(jid, attempt)}"):
            out.append(jid)
    return out


def test_forged_huge_reservation_leaves_no_orphaned_capacity(
    store: RedisStore, small: Pool
) -> None:
    """A forged ``reserved_gib = 1e308`` once made HINCRBY fail mid-pipeline, and the other
    jobs of the chunk held capacity with no RQ job. Now: the forged job is refused with its
    reason, the others are placed and enqueued, and Redis adds up."""
    client = Client(store=store)
    client.submit_many([spec(i) for i in range(4)])
    store.set_fields("job-0", {"reserved_gib": "1e308"})
    svc = SchedulerService(store, small)
    svc.step()
    assert _holders_without_rq_job(store) == []
    forged = store.get_job("job-0")
    assert forged is not None and forged["state"] != "placed"
    assert "job-0" not in store.allocations()
    # The intake's bounds (issue 12) refuse it before placement; the commit script's own
    # checks are the second line (the tests below).
    assert forged["state"] == "rejected" and "reserved_gib" in forged["reason"]
    for i in range(1, 4):
        assert client.get(f"job-{i}").status() == "placed"
    svc.assert_consistent()
    assert_ledger_matches_allocations(store)


def test_meta_alloc_and_event_are_derived_from_the_one_record(
    store: RedisStore, small: Pool
) -> None:
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from scheduler.service._commit import alloc_record, job_meta, placed_event, record_option
    from scheduler.service.store.records import PlacementRecord

    client = Client(store=store)
    client.submit_many([spec(i) for i in range(3)])
    svc = SchedulerService(store, small)
    assert svc.step().placed == 3
    events = {e["job_id"]: e for _, e in store.events()}
    for i in range(3):
        jid = f"job-{i}"
        raw = store.get_job(jid)
        assert raw is not None
        rec = PlacementRecord.model_validate_json(raw["placement"])
        assert rec.job_id == jid and rec.used_mib is not None and rec.used_mib > 0
        # The committed option the core holds is exactly what the record rebuilds.
        assert record_option(rec) == svc.core.state.option_of(jid)
        assert json.loads(store.allocations()[jid]) == json.loads(json.dumps(alloc_record(rec)))
        job = Job.fetch(rec.rq_job_id, connection=store.raw, serializer=JSONSerializer)
        assert job.meta == json.loads(json.dumps(job_meta(rec)))
        assert job.args == [jid, rec.attempt]
        got = dict(events[jid])
        want = json.loads(json.dumps(placed_event(rec)))
        got.pop("ts"), want.pop("ts")
        assert got == want
        decision = json.loads(raw["decision"])
        assert decision["options"][decision["chosen"]] == record_option(rec).to_dict()
        if rec.runner_up is not None:
            assert decision["options"][decision["runner_up"]] == rec.runner_up


def test_the_fast_record_forms_equal_pydantic_and_option_forms(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader builds its records without model_construct and writes them with orjson, and
    the allocation's option without an Option: each must equal what those would build."""
    import scheduler.service.leader as leader
    from scheduler.service._commit import option_dict, record_json, record_option
    from scheduler.service.store.records import PlacementRecord

    built: list[PlacementRecord] = []
    real = leader.placement_record

    def keep(*args, **kwargs):  # type: ignore[no-untyped-def]
        rec = real(*args, **kwargs)
        built.append(rec)
        return rec

    monkeypatch.setattr(leader, "placement_record", keep)
    Client(store=store).submit_many([spec(i, batch_size=1 + i % 4) for i in range(12)])
    assert SchedulerService(store, small).step().placed > 0
    assert {r.kind for r in built} == {"whole", "mig", "shared"}  # every kind of slot
    for rec in built:
        ref = PlacementRecord.model_construct(**rec.__dict__)
        assert list(rec.__dict__) == list(PlacementRecord.model_fields)
        assert rec == ref and rec.model_fields_set == ref.model_fields_set
        assert json.loads(record_json(rec)) == json.loads(ref.model_dump_json())
        stored = PlacementRecord.model_validate_json(record_json(rec))
        assert stored == PlacementRecord.model_validate_json(ref.model_dump_json())
        assert option_dict(rec) == record_option(rec).to_dict()
        assert list(option_dict(rec)) == list(record_option(rec).to_dict())


def _setup(store: RedisStore, data: dict, n_jobs: int) -> SchedulerService:
    """A leader that owns the pool in Redis, and ``n_jobs`` pending jobs job-0.."""
    pool = Pool.from_dict(data)
    svc = SchedulerService(store, pool, window=0)
    svc.step()  # takes the lease, writes the pool; window 0 places nothing
    Client(store=store).submit_many([spec(i) for i in range(n_jobs)])
    return svc


def _alloc(gpus: list[int], used: object, kind: int = 0, attempt: int = 1) -> str:
    return dumps(
        {"attempt": attempt, "kind": kind, "gpus": gpus, "used_mib": used, "mig_mask": 0,
         "reserved_mib": 0, "option": {}}
    )  # fmt: skip


def _commit(store: RedisStore, svc: SchedulerService, jid: str, alloc: str) -> str:
    c = Commit(jid, 0, alloc, "{}", "{}")
    return store.commit([c], svc.token)[0]


def test_a_gpu_listed_twice_is_not_booked_twice(store: RedisStore) -> None:
    svc = _setup(store, SHARED, 2)
    got = _commit(store, svc, "job-0", _alloc([0, 0], 1000, kind=2))
    assert got.startswith("bad:") and "twice" in got
    assert _commit(store, svc, "job-0", _alloc([0, 1], 1000, kind=2)).startswith("bad:")
    # Two jobs of one chunk on the same whole GPU: the second sees the first's booking.
    whole = _setup_fresh(store, WHOLE, 2)
    res = store.commit(
        [Commit(f"job-{i}", 0, _alloc([1], 81559), "{}", "{}") for i in range(2)], whole.token
    )
    assert res[0].startswith("ok:") and res[1] == "err:GPU 1 is taken"
    assert_ledger_matches_allocations(store)


def _setup_fresh(store: RedisStore, data: dict, n_jobs: int) -> SchedulerService:
    store.r.flushdb()
    return _setup(store, data, n_jobs)


def test_a_malformed_value_rejects_one_job_and_commits_the_rest(store: RedisStore) -> None:
    svc = _setup(store, WHOLE, 4)
    bad_values: list[object] = [1e308, -5, 1.5, "lots"]
    commits = [
        Commit("job-0", 0, _alloc([0], 81559), "{}", "{}"),
        Commit("job-1", 0, _alloc([1], bad_values[0]), "{}", "{}"),
        Commit("job-2", 0, "not json", "{}", "{}"),
        Commit("job-3", 0, _alloc([3], 81559), "{}", "{}"),
    ]
    res = store.commit(commits, svc.token)
    assert res[0].startswith("ok:") and res[3].startswith("ok:")
    assert res[1].startswith("bad:used_mib") and res[2].startswith("bad:")
    assert sorted(store.allocations()) == ["job-0", "job-3"]
    for v in bad_values[1:]:
        assert _commit(store, svc, "job-1", _alloc([1], v)).startswith("bad:used_mib")
    assert_ledger_matches_allocations(store)


def test_release_takes_back_exactly_what_the_commit_added(store: RedisStore) -> None:
    svc = _setup(store, SHARED, 1)
    assert _commit(store, svc, "job-0", _alloc([0], 12345, kind=2)).startswith("ok:")
    assert store.gpu_state()["0:used"] == 12345
    assert store.gpu_state()["0:shared"] == 1
    assert store.start("job-0", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-0", 1, "succeeded", "{}", "done") == "ok"
    g = store.gpu_state()
    assert g["0:used"] == 0 and g["0:shared"] == 0


@pytest.mark.parametrize("action", ["finish", "requeue", "cancel"])
def test_a_garbage_allocation_does_not_break_finish_requeue_or_cancel(
    store: RedisStore, action: str
) -> None:
    svc = _setup(store, SHARED, 2)
    assert _commit(store, svc, "job-0", _alloc([0], 1000, kind=2)).startswith("ok:")
    assert _commit(store, svc, "job-1", _alloc([0], 2000, kind=2)).startswith("ok:")
    for jid in ("job-0", "job-1"):
        assert store.start(jid, 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    store.r.hset(store.keys.allocs, "job-0", "{garbage")
    if action == "finish":
        assert store.finish("job-0", 1, "succeeded", "{}", "done") == "ok"
    elif action == "requeue":
        assert store.requeue("job-0", 1, reason="lost", counter="lost") == "requeued"
    else:
        assert store.cancel("job-0", "user") == "requested"
        assert store.finish("job-0", 1, "cancelled", "{}", "cancelled") == "ok"
    assert "job-0" not in store.allocations()
    # What job-1 holds is still counted; the garbage entry's unknown share is not.
    g = store.gpu_state()
    assert g["0:used"] == 2000 and g["0:shared"] == 1
    assert_ledger_matches_allocations(store)


def test_an_empty_token_never_passes_the_leader_fence(store: RedisStore) -> None:
    svc = _setup(store, WHOLE, 1)
    c = Commit("job-0", 0, _alloc([0], 81559), "{}", "{}")
    assert store.commit([c], "") == ["err:not the leader"]
    assert store.commit([c], "someone-else") == ["err:not the leader"]
    assert store.allocations() == {}
    assert store.commit([c], svc.token)[0].startswith("ok:")


def test_the_leader_rejects_a_job_whose_commit_is_malformed_and_places_the_rest(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import scheduler.service.leader as leader

    real = leader.build_commit

    def corrupt(rec, expected, decision_json):  # type: ignore[no-untyped-def]
        c = real(rec, expected, decision_json)
        if rec.job_id == "job-1":
            a = json.loads(c.alloc_json)
            a["used_mib"] = 1e308
            c = dataclasses.replace(c, alloc_json=json.dumps(a))
        return c

    monkeypatch.setattr(leader, "build_commit", corrupt)
    Client(store=store).submit_many([spec(i) for i in range(4)])
    svc = SchedulerService(store, small)
    s = svc.step()
    assert s.placed == 3
    bad = store.get_job("job-1")
    assert bad is not None and bad["state"] == "rejected"
    assert bad["reason"].startswith("malformed placement refused at commit: used_mib")
    assert _holders_without_rq_job(store) == []
    assert sorted(store.allocations()) == ["job-0", "job-2", "job-3"]
    assert any(e["event"] == "rejected" and e["job_id"] == "job-1" for _, e in store.events())
    svc.step()
    svc.assert_consistent()
    assert_ledger_matches_allocations(store)


def _chunked_leader(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch, n_jobs: int
) -> SchedulerService:
    """A leader whose commits go out two jobs per chunk (each chunk its own script call)."""
    import scheduler.service._commit as commit_mod
    import scheduler.service.leader as leader_mod

    monkeypatch.setattr(commit_mod, "COMMIT_CHUNK", 2)
    monkeypatch.setattr(leader_mod, "COMMIT_CHUNK", 2)
    Client(store=store).submit_many([spec(i) for i in range(n_jobs)])
    return SchedulerService(store, small)


def test_chunks_sent_while_the_next_is_built_all_commit_and_enqueue(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _chunked_leader(store, small, monkeypatch, 5)
    assert svc.step().placed == 5
    assert store.count("placed") == 5 and _holders_without_rq_job(store) == []
    svc.assert_consistent()
    assert_ledger_matches_allocations(store)


def test_a_chunk_that_fails_to_build_leaves_the_sent_chunks_enqueued(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk k is in Redis while chunk k+1 is built: when that build raises, the step still
    fails, but only after what committed is enqueued (no capacity held without an RQ job)."""
    import scheduler.service.leader as leader_mod

    svc = _chunked_leader(store, small, monkeypatch, 5)
    real = leader_mod.build_commit
    calls = []

    def flaky(*a: object, **k: object) -> Commit:
        calls.append(1)
        if len(calls) == 3:  # the first job of the second chunk
            raise RuntimeError("boom")
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(leader_mod, "build_commit", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        svc.step()
    assert store.count("placed") == 2 and store.count("pending") == 3
    assert _holders_without_rq_job(store) == []
    assert_ledger_matches_allocations(store)


def test_a_lease_lost_between_chunks_commits_nothing_after_it(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _chunked_leader(store, small, monkeypatch, 5)
    assert svc._lead()
    monkeypatch.setattr(svc, "_still_leader", lambda: False)
    now = time.time()
    svc._ingest(now)
    placed = [d for d in svc.core.tick(now) if d.state == "placed"]
    assert len(placed) == 5
    assert svc._commit(placed, now) == (2, 3)
    assert store.count("placed") == 2 and _holders_without_rq_job(store) == []


def test_a_decision_is_written_only_for_a_job_whose_commit_passed(store: RedisStore) -> None:
    """commit.lua never sees the decisions (kilobytes it checks nothing in): the store writes
    each one after its job's commit answered ok, and none for a refused or malformed one."""
    svc = _setup(store, WHOLE, 3)
    commits = [
        Commit("job-0", 0, _alloc([0], 81559), "{}", '{"d": 0}'),
        Commit("job-1", 0, _alloc([0], 81559), "{}", '{"d": 1}'),  # the same GPU: refused
        Commit("job-2", 0, "not json", "{}", '{"d": 2}'),
    ]
    res = store.commit(commits, svc.token)
    assert res[0].startswith("ok:") and res[1].startswith("err:") and res[2].startswith("bad:")
    rows = store.get_fields(["job-0", "job-1", "job-2"], ["decision"])
    assert rows == [['{"d": 0}'], [None], [None]]
    # commit_send alone leaves them to the caller (the leader writes them before the RQ job).
    again = [Commit("job-1", 0, _alloc([1], 81559), "{}", '{"d": 1}')]
    assert store.commit_send(again, svc.token)()[0].startswith("ok:")
    assert store.get_fields(["job-1"], ["decision"]) == [[None]]
    store.enqueue_send([], decisions=[("job-1", '{"d": 1}')])()
    assert store.get_fields(["job-1"], ["decision"]) == [['{"d": 1}']]


def test_a_post_commit_send_that_fails_is_made_again_the_ordinary_way(
    store: RedisStore, small: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decisions and RQ jobs of a chunk go out without waiting (calls_send); when that
    send fails, the reader makes the calls again through redis-py, so every committed job
    still has its decision and its RQ job."""
    import redis

    svc = _chunked_leader(store, small, monkeypatch, 5)
    real = redis.Connection.send_packed_command
    sends: list[int] = []

    def flaky(self, command, check_health=True):  # type: ignore[no-untyped-def]
        sent = b"".join(command) if isinstance(command, list) else bytes(command)
        if b"$8\r\ndecision\r\n" in sent:
            sends.append(1)
            if len(sends) == 1:  # the first chunk's decisions and RQ jobs
                raise redis.ConnectionError("reset by peer")
        return real(self, command, check_health)

    monkeypatch.setattr(redis.Connection, "send_packed_command", flaky)
    assert svc.step().placed == 5
    assert len(sends) >= 3 and _holders_without_rq_job(store) == []
    rows = store.get_fields([f"job-{i}" for i in range(5)], ["decision"])
    assert all(json.loads(r[0] or "null")["state"] == "placed" for r in rows)
    assert_ledger_matches_allocations(store)
