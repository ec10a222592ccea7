"""Serving deployments on a real Redis: replicas placed as gangs with their engine values,
scale up / down / to zero, duration expiry, and cancel releasing capacity."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from predictor.serving import ENGINE_PLACEHOLDERS
from scheduler.core.pool import Pool
from scheduler.exceptions import ServiceError
from scheduler.service.client import Client
from scheduler.service.deployments import DeploymentHandle, expire_due, hostable, plan_for_pool
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec
from tests.rq_drain import drain
from workers.worker import NodeWorker

POOL = Pool.from_dict(
    {
        "name": "serve",
        "nodes": [
            {"name": "h100-a", "gpu": "H100-80GB", "count": 4},
            {"name": "h100-b", "gpu": "H100-80GB", "count": 4},
            {"name": "a100-0", "gpu": "A100-80GB", "count": 2},
        ],
    }
)

#: An 8B chat deployment whose plan on POOL is two-GPU replicas (asserted, not assumed).
CHAT = {"id": "chat", "model": "llama-3.1-8b", "task": "serve", "request_rate": 150.0}


@pytest.fixture
def svc(store: RedisStore) -> SchedulerService:
    s = SchedulerService(store, POOL, leader_election=False)
    s.step()  # writes the pool into Redis: the client plans for it
    return s


def _deploy(store: RedisStore, **over: Any) -> DeploymentHandle:
    h = Client(store=store).submit({**CHAT, **over})
    assert isinstance(h, DeploymentHandle)
    return h


def _placements(client: Client, ids: list[str]) -> dict[str, Any]:
    return {r: client.get(r).placement for r in ids}


def test_replicas_are_placed_as_gangs_with_engine_values(
    store: RedisStore, svc: SchedulerService
) -> None:
    client = Client(store=store)
    h = _deploy(store)
    d = h.view()
    o = d.option
    assert d.state == "active" and o["meets_slo"] and o["gpu"] == "H100-80GB"
    assert o["tensor_parallel"] >= 2 and d.replicas >= 2, "the test wants multi-GPU replicas"
    assert len(d.replica_states) == d.replicas
    assert set(d.engine) == set(ENGINE_PLACEHOLDERS)
    assert d.engine["tensor_parallel_size"] == str(o["tensor_parallel"])
    assert d.engine["max_num_seqs"] == str(o["max_batch"])
    batch = client.submit(inference_spec(0))  # a batch job shares the pool
    svc.step()
    placements = _placements(client, list(d.replica_states))
    gpus: set[int] = set()
    for rid, p in placements.items():
        assert client.get(rid).status() == "placed"
        assert p is not None and p.gpu_type == o["gpu"] and p.kind == "whole"
        assert len(p.gpu_indices) == o["tensor_parallel"]  # one TP gang ...
        assert {POOL.nodes[int(POOL.gpu_node[g])].name for g in p.gpu_indices} == {p.node}
        assert p.engine == d.engine
        meta = json.loads(store.r.hget(f"rq:job:{p.rq_job_id}", "meta"))
        assert meta["engine"] == d.engine and meta["snugfit_job"] == rid
        gpus |= set(p.gpu_indices)
    assert len(gpus) == d.replicas * o["tensor_parallel"]  # ... each on its own GPUs
    assert batch.status() == "placed"
    assert not set(batch.placement.gpu_indices) & gpus  # type: ignore[union-attr]
    svc.assert_consistent()


def test_scale_up_down_and_to_zero(store: RedisStore, svc: SchedulerService) -> None:
    h = _deploy(store, request_rate=70.0)
    svc.step()
    before = h.view()
    assert len(before.live) == before.replicas >= 1
    up = h.scale(150.0)
    assert up.after > up.before and len(up.added) == up.after - up.before
    svc.step()
    d = h.view()
    assert len(d.live) == up.after and d.replicas == up.after and d.request_rate == 150.0
    assert all(s == "placed" for s in d.replica_states.values())
    down = h.scale(70.0)
    assert down.after == before.replicas and set(down.removed) == set(up.added)  # newest first
    svc.step()
    assert len(h.view().live) == before.replicas
    assert len(store.alloc_ids()) == before.replicas
    zero = h.scale(0)
    assert zero.after == 0 and zero.usd_per_hour == 0 and zero.cold_start_s > 0
    assert "cold start" in zero.summary()
    assert h.view().live == [] and store.alloc_ids() == []
    assert h.status() == "active"  # a floor of zero: it scales back up
    assert h.scale(70.0).after == before.replicas
    with pytest.raises(ServiceError, match="--rate"):
        h.scale(-1)


def test_cancel_stops_running_replicas_and_releases_capacity(
    store: RedisStore, svc: SchedulerService, tmp_path: Path
) -> None:
    h = _deploy(store, request_rate=10.0)
    svc.step()
    d = h.view()
    rid = next(iter(d.replica_states))
    node = Client(store=store).get(rid).placement.node  # type: ignore[union-attr]
    w = NodeWorker(
        store,
        node,
        pool=POOL,
        simulate=True,
        time_scale=1.0,
        heartbeat_s=0.05,
        history_path=tmp_path / "h.jsonl",
        log_path=tmp_path / "log.jsonl",
    )
    got: list[str] = []

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 20
        while Client(store=store).get(rid).status() != "running":
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        got.append(h.cancel())

    t = threading.Thread(target=cancel_when_running)
    t.start()
    drain(w)  # an until-cancelled replica runs until the cancel stops it
    t.join()
    assert got == ["cancelled"]
    view = h.view()
    assert view.state == "cancelled" and set(view.replica_states.values()) == {"cancelled"}
    assert store.alloc_ids() == []
    assert not (tmp_path / "h.jsonl").exists()  # an engine's peak is not a measurement


def test_simulated_replica_runs_its_duration(
    store: RedisStore, svc: SchedulerService, tmp_path: Path
) -> None:
    h = _deploy(store, request_rate=10.0, duration_s=2.0)
    svc.step()
    rid = next(iter(h.view().replica_states))
    job = Client(store=store).get(rid)
    w = NodeWorker(
        store,
        job.placement.node,
        pool=POOL,
        simulate=True,
        time_scale=0.25,  # type: ignore[union-attr]
        heartbeat_s=0.05,
        history_path=tmp_path / "h.jsonl",
        log_path=tmp_path / "log.jsonl",
    )
    t0 = time.monotonic()
    drain(w)
    assert time.monotonic() - t0 >= 0.5  # 2 s x 0.25, exactly (no truth factor)
    assert job.status() == "succeeded"
    assert job.outcome is not None and job.outcome.runtime_s == pytest.approx(2.0)
    assert store.alloc_ids() == []


def test_leader_expires_a_deployment_whose_duration_ran_out(
    store: RedisStore, svc: SchedulerService
) -> None:
    h = _deploy(store, request_rate=70.0, duration_s=60.0)
    svc.step()
    assert store.alloc_ids()
    assert expire_due(store, time.time()) == 0  # not yet
    assert expire_due(store, time.time() + 61) == 1
    d = h.view()
    assert d.state == "expired" and "duration_s" in d.reason
    assert set(d.replica_states.values()) == {"cancelled"}
    assert store.alloc_ids() == []
    assert expire_due(store, time.time() + 61) == 0  # exactly once
    with pytest.raises(ServiceError, match="expired"):
        h.scale(10.0)


def test_submit_is_idempotent_and_cancel_by_id(store: RedisStore, svc: SchedulerService) -> None:
    client = Client(store=store)
    a = _deploy(store, request_rate=10.0)
    b = _deploy(store, request_rate=10.0)
    assert a.id == b.id and len(a.view().replica_states) == a.view().replicas
    assert client.cancel("chat") == "cancelled" and client.cancel("chat") == "cancelled"
    with pytest.raises(Exception, match="serving deployment"):
        client.get("chat")


def test_hostile_engine_field_is_rejected_not_placed(
    store: RedisStore, svc: SchedulerService
) -> None:
    h = _deploy(store, request_rate=10.0)
    rid = next(iter(h.view().replica_states))
    store.set_fields(rid, {"engine": json.dumps({"LD_PRELOAD": "/tmp/evil.so"})})
    svc.step()
    job = Client(store=store).get(rid)
    assert job.status() == "rejected" and "`engine`" in job.reason


def test_plan_for_pool_keeps_only_options_the_pool_hosts() -> None:
    from predictor.spec import parse_spec

    spec = parse_spec({**CHAT, "request_rate": 2.0})
    p, k, reason = plan_for_pool(spec, POOL)
    assert k is not None and hostable(p.options[k], POOL)
    assert p.options[k].gpu in POOL.types_present() and p.options[k].mig_profile is None
    if p.chosen != k:
        assert "is not in the pool" in reason
    only_b200 = Pool.from_dict({"name": "b", "nodes": [{"name": "b", "gpu": "B200-180GB"}]})
    assert all(o.gpu == "B200-180GB" for o in plan_for_pool(spec, only_b200)[0].options)


def test_a_mig_replica_gets_its_planned_slice(redis_url: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    mig = Pool.from_dict(
        {
            "name": "mig",
            "nodes": [{"name": "m", "gpu": "A100-80GB", "mode": "mig", "mig": "dynamic"}],
        }
    )
    svc = SchedulerService(store, mig, leader_election=False)
    svc.step()
    h = _deploy(store, request_rate=2.0, slo_ttft_s=0.5, slo_tpot_s=0.05)
    o = h.view().option
    assert o["gpu"] == "A100-80GB" and o["mig_profile"] is not None
    svc.step()
    for rid in h.view().replica_states:
        p = Client(store=store).get(rid).placement
        assert p is not None and p.kind == "mig" and p.mig_profile == o["mig_profile"]
    svc.assert_consistent()
