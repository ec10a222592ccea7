"""Scheduler service: commit is atomic and re-checked, leader lease, reclaim, rejection."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from scheduler.core.pool import Pool, load_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.protocol import Store
from tests.jobs import inference_spec as spec


@pytest.fixture
def small() -> Pool:
    return load_pool("datasets/pools/small.toml")


def test_step_places_commits_and_enqueues(store: Store, small: Pool, tmp_path: Any) -> None:
    client = Client(store=store)
    client.submit_many([spec(i) for i in range(5)])
    log_path = tmp_path / "log.jsonl"
    svc = SchedulerService(store, small, log_path=log_path)
    s = svc.step()
    assert s.leader and s.placed == 5
    for h in client.jobs():
        assert h.status() == "placed"
        p = h.placement
        assert p is not None and p.attempt == 1 and p.queue == f"snugfit:node:{p.node}"
        assert store.enqueued(p.node, h.id, 1)
    svc.assert_consistent()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["placed"] * 5
    assert all(e["option"]["fits_now"] and e["cost_usd"] > 0 for e in lines)
    assert len(store.events()) == 5


def test_job_that_fits_nowhere_is_rejected_with_reason(store: Store, small: Pool) -> None:
    client = Client(store=store)
    h = client.submit(spec("huge", model="llama-2-70b", gpu="A100-40GB", n_gpus=1))
    SchedulerService(store, small).step()
    assert h.status() == "rejected"
    assert h.reason
    assert h.decision is not None and h.decision["state"] == "rejected"


def test_commit_refuses_capacity_taken_by_another_scheduler(store: Store, small: Pool) -> None:
    client = Client(store=store)
    a = SchedulerService(store, small, leader_election=False)
    b = SchedulerService(store, small, leader_election=False)
    a.step()  # both have synced an empty pool
    b.step()
    # Over half a B200 at its calibrated upper bound (~130 GiB), under a whole one (180 GiB):
    # exactly one job per B200, so the two B200s admit two of the six.
    big = {
        "id": "",
        "model": "llama-3.1-8b",
        "task": "full_finetune",
        "batch_size": 2,
        "seq_len": 2048,
        "steps": 10,
        "gpu": "B200-180GB",
    }
    client.submit_many([{**big, "id": f"b{i}"} for i in range(6)])
    # Force both to decide from the same stale view before either commits.
    a._ingest(time.time())
    b._ingest(time.time())
    da = a.core.tick(time.time())
    db = b.core.tick(time.time())
    pa, _ = a._commit([d for d in da if d.state == "placed"], time.time())
    pb, conflicts = b._commit([d for d in db if d.state == "placed"], time.time())
    assert pa == 2  # two B200s in the pool
    assert pb == 0 and conflicts >= 1
    a.assert_consistent()
    assert client.counts()["placed"] == 2
    b.step()  # b resyncs and places nothing more
    assert client.counts()["placed"] == 2
    b.assert_consistent()


def test_only_one_leader_and_standby_takes_over(store: Store, small: Pool) -> None:
    a = SchedulerService(store, small, lease_ttl_s=0.3)
    b = SchedulerService(store, small, lease_ttl_s=0.3)
    assert a.step().leader
    assert not b.step().leader
    Client(store=store).submit(spec(0))
    assert not b.step().leader
    assert store.leader() == a.token
    time.sleep(0.4)  # a "dies": stops renewing
    s = b.step()
    assert s.leader and s.placed == 1
    assert store.leader() == b.token
    # The old leader's lease is gone: its commits are fenced out.
    a.is_leader = True
    a._renewed_at = time.monotonic()
    assert not a.step().placed


def test_expired_lease_releases_capacity_and_requeues(store: Store, small: Pool) -> None:
    client = Client(store=store)
    h = client.submit(spec(0))
    svc = SchedulerService(store, small)
    svc.step()
    assert store.start(h.id, 1, "w1", int(time.time() * 1000) - 1) == "ok"
    assert store.alloc_ids() == [h.id]
    s = svc.step()
    assert s.reclaimed == 1
    # Reclaimed and immediately placed again as attempt 2.
    assert h.status() == "placed" and h.placement is not None and h.placement.attempt == 2
    assert h.record()["lost"] == "1"
    # The stale worker of attempt 1 cannot finish over attempt 2.
    assert store.finish(h.id, 1, "succeeded", "{}", "") == "stale"
    assert store.heartbeat(h.id, 1, 0) == "lost"
    kinds = [e["event"] for _, e in store.events()]
    assert kinds.count("reclaimed") == 1 and kinds.count("placed") == 2
    svc.assert_consistent()


def test_lost_leases_beyond_max_retries_fail_the_job(store: Store, small: Pool) -> None:
    client = Client(store=store, max_retries=0)
    h = client.submit(spec(0))
    svc = SchedulerService(store, small)
    svc.step()
    store.start(h.id, 1, "w1", 0)
    svc.step()
    assert h.status() == "failed"
    assert "lease" in h.reason
    assert store.alloc_ids() == []


def test_cancel_placed_job_releases_capacity(store: Store, small: Pool) -> None:
    client = Client(store=store)
    h = client.submit(spec(0))
    svc = SchedulerService(store, small)
    svc.step()
    assert h.cancel() == "cancelled"
    assert store.alloc_ids() == []
    assert store.start(h.id, 1, "w", 10**13) == "job is cancelled"
    svc.step()
    assert svc.core.state.jobs == ()


def test_running_job_cancel_is_requested_then_finished(store: Store, small: Pool) -> None:
    h = Client(store=store).submit(spec(0))
    SchedulerService(store, small).step()
    store.start(h.id, 1, "w", 10**13)
    assert h.cancel() == "requested"
    assert store.heartbeat(h.id, 1, 10**13) == "cancel"
    assert store.finish(h.id, 1, "cancelled", "{}", "stopped") == "ok"
    assert h.status() == "cancelled"


def test_oom_requeue_raises_the_reservation(store: Store, small: Pool) -> None:
    h = Client(store=store).submit(spec(0))
    svc = SchedulerService(store, small)
    svc.step()
    first = h.placement
    assert first is not None
    store.start(h.id, 1, "w", 10**13)
    got = store.requeue(h.id, 1, reason="oom", counter="ooms", reserved_gib=first.reserved_gib * 2)
    assert got == "requeued"
    svc.step()
    second = h.placement
    assert second is not None and second.attempt == 2
    assert second.reserved_gib >= 2 * first.reserved_gib - 1e-6


def test_pool_change_with_jobs_holding_capacity_is_refused(store: Store, small: Pool) -> None:
    from scheduler.exceptions import ServiceError

    Client(store=store).submit(spec(0))
    SchedulerService(store, small).step()
    other = load_pool("datasets/pools/mixed.toml")
    with pytest.raises(ServiceError, match="another pool"):
        SchedulerService(store, other, leader_election=False).step()


def test_window_bounds_what_the_scheduler_holds(store: Store) -> None:
    tiny = Pool.from_dict(
        {"name": "tiny", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 1}]}
    )
    Client(store=store).submit_many([spec(i) for i in range(30)])
    svc = SchedulerService(store, tiny, window=10)
    s = svc.step()
    assert s.placed == 1 and s.ingested == 10
    assert len(svc.core.pending) == 9


def test_stored_decision_is_compact_and_lossless(store: Store, small: Pool) -> None:
    from scheduler.core.decision import Decision

    client = Client(store=store)
    h = client.submit(spec("c"))
    svc = SchedulerService(store, small)
    svc.step()
    raw = json.loads(store.get_job(h.id)["decision"])  # type: ignore[index]
    assert "option_columns" in raw  # every option's numbers, as columns
    n = len(raw["option_columns"]["kind"])
    assert n > 1 and len(raw["options"]) == n
    # Only the chosen option (and the runner-up) are spelled out where readers index them.
    assert raw["options"][raw["chosen"]]["fits_now"] is True
    assert sum(o is not None for o in raw["options"]) <= 2
    d = Decision.from_dict(raw)
    assert d.chosen_option == svc.core.state.option_of(h.id)
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict(compact=True)))) == d
    full = h.decision
    assert full is not None and all(isinstance(o, dict) for o in full["options"])
    assert len(full["options"]) == n


def test_placed_job_that_no_worker_starts_is_reclaimed(store: Store, small: Pool) -> None:
    client = Client(store=store)
    h = client.submit(spec("idle-node"))
    svc = SchedulerService(store, small, placement_lease_s=0.2)
    svc.step()
    assert h.status() == "placed" and store.alloc_ids() == [h.id]
    time.sleep(0.3)  # past the placement lease; no worker ever started it
    s = svc.step()
    assert s.reclaimed == 1
    assert h.record()["lost"] == "1" and "never started" in h.record()["reason"]
    # Requeued and placed again (attempt 2) on the capacity it released.
    svc.step()
    assert h.status() == "placed" and h.placement is not None and h.placement.attempt == 2
    assert store.start(h.id, 1, "late-worker", 10**13) != "ok"  # the stale attempt is fenced
    kinds = [e["event"] for _, e in store.events()]
    assert "reclaimed" in kinds
    svc.assert_consistent()


def test_started_job_is_not_reclaimed_by_the_placement_lease(store: Store, small: Pool) -> None:
    h = Client(store=store).submit(spec("started"))
    svc = SchedulerService(store, small, placement_lease_s=0.2)
    svc.step()
    assert store.start(h.id, 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    time.sleep(0.3)
    assert svc.step().reclaimed == 0
    assert h.status() == "running"


def test_placement_latency_feeds_telemetry(store: Store, small: Pool) -> None:
    seen: list[float] = []

    class Probe:
        def observe_placement_latency(self, seconds: float) -> None:
            seen.append(seconds)

    Client(store=store).submit_many([spec(i) for i in range(3)])
    SchedulerService(store, small, telemetry=Probe()).step()
    assert len(seen) == 3 and all(0 <= x < 60 for x in seen)


def test_step_batch_adapts_to_the_measured_cost_per_job(store: Store, small: Pool) -> None:
    client = Client(store=store)
    client.submit_many([spec(f"a{i}") for i in range(10)])
    svc = SchedulerService(store, small, step_target_s=1e-9, window=500)
    assert svc.batch_size() == 500  # nothing measured yet: the whole window
    assert svc.step().ingested == 10
    assert svc.batch_size() == 64  # a tiny step budget: the smallest batch
    client.submit_many([spec(f"b{i}") for i in range(100)])
    assert svc.step().ingested == 64
    assert svc.step().ingested == 36  # the rest, oldest first, on the next step
    slow = SchedulerService(store, small, step_target_s=3600.0, window=500)
    slow._s_per_job = 0.001
    assert slow.batch_size() == 500  # a generous budget: capped by the window
    default = SchedulerService(store, small, window=500)
    default._s_per_job = 1.0
    assert default.batch_size() == 500  # no budget by default: the whole window


def test_requested_baseline_live_asks_for_the_pinned_or_a_big_enough_type(
    store: Store, small: Pool
) -> None:
    # The live `requested` baseline uses the same definition as the simulated one
    # (core.requests.requested_type): a pinned job asks for its pinned type, and a job that no
    # H100 holds asks for the smallest type that does, instead of being refused.
    client = Client(store=store)
    pinned = client.submit(spec("pinned", gpu="A100-40GB"))
    big = client.submit(spec("big", model="mixtral-8x7b", batch_size=1))  # ~100 GiB
    SchedulerService(store, small, policy="requested").step()
    assert pinned.status() == "placed", pinned.reason
    assert pinned.placement is not None and pinned.placement.gpu_type == "A100-40GB"
    assert big.status() == "placed", big.reason
    # The pool has no whole H200 (its H200s are shared), so the user asks for a B200.
    assert big.placement is not None and big.placement.gpu_type == "B200-180GB"
    assert big.placement.kind == "whole"
