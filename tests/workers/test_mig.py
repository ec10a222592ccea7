"""MIG on the node (fake NVML): dynamic slices are created for a job and destroyed after it;
a static layout that does not match the GPU makes the node refuse work, saying why."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from workers.nvml import FakeGpu, FakeNvml
from workers.worker import NodeWorker

CVD = "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])"
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 80 << 30}


def mig_pool(mig: Any) -> Pool:
    node = {"name": "n1", "gpu": "H100-80GB", "count": 1, "mode": "mig", "mig": mig}
    return Pool.from_dict({"name": "mig", "nodes": [node]})


def worker(store: RedisStore, pool: Pool, nvml: FakeNvml) -> NodeWorker:
    return NodeWorker(store, "n1", pool=pool, nvml=nvml, heartbeat_s=0.05)


def test_dynamic_slice_is_created_for_the_job_and_destroyed_after(store: RedisStore) -> None:
    pool = mig_pool("dynamic")
    nvml = FakeNvml([FakeGpu(**H100, mig_mode=True)])
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", CVD]))
    SchedulerService(store, pool).step()
    p = h.placement
    assert p is not None and p.kind == "mig"
    w = worker(store, pool, nvml)
    w.work(burst=True)
    assert h.status() == "succeeded", h.reason
    assert nvml.mig_log == [
        ("create", 0, p.mig_profile, p.mig_start),
        ("destroy", 0, p.mig_profile, p.mig_start),
    ]
    shown = next(x for x in h.logs().splitlines() if x.startswith("CVD="))[4:]
    assert shown.startswith("MIG-")  # the slice, never the parent GPU's index or UUID
    assert nvml.gpus[0].mig == [] and w.ctx.mig_uuids == {}
    assert store.nodes()["n1"]["refuse"] == ""


def test_dynamic_node_clears_instances_a_dead_worker_left(store: RedisStore) -> None:
    nvml = FakeNvml([FakeGpu(**H100, mig_mode=True, mig=[("1g.10gb", 3, 10 << 30)])])
    w = worker(store, mig_pool("dynamic"), nvml)
    w.work(burst=True)
    assert nvml.gpus[0].mig == [] and nvml.mig_log == [("destroy", 0, "1g.10gb", 3)]


def test_static_layout_that_matches_runs_on_its_slice_and_keeps_it(store: RedisStore) -> None:
    pool = mig_pool([["3g.40gb@4", "4g.40gb@0"]])
    nvml = FakeNvml([FakeGpu(**H100, mig=[("4g.40gb", 0, 40 << 30), ("3g.40gb", 4, 40 << 30)])])
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", CVD]))
    SchedulerService(store, pool).step()
    w = worker(store, pool, nvml)
    w.work(burst=True)
    assert h.status() == "succeeded", h.reason
    assert nvml.mig_log == [] and len(nvml.gpus[0].mig) == 2
    assert h.placement is not None
    key = (0, h.placement.mig_profile, h.placement.mig_start)
    assert f"CVD={w.ctx.mig_uuids[key]}" in h.logs()


@pytest.mark.parametrize(
    ("gpu", "needle"),
    [
        ({"mig": [("7g.80gb", 0, 80 << 30)]}, "static MIG layout is [3g.40gb@4, 4g.40gb@0]"),
        ({"mig_mode": False}, "MIG mode is off"),
    ],
)
def test_static_layout_mismatch_makes_the_node_refuse_work(
    store: RedisStore, gpu: dict[str, Any], needle: str
) -> None:
    pool = mig_pool([["3g.40gb", "4g.40gb"]])
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", CVD]))
    SchedulerService(store, pool).step()
    assert h.status() == "placed"
    nvml = FakeNvml([FakeGpu(**H100, **gpu)])
    w = worker(store, pool, nvml)
    assert w.work(burst=True) is False
    refuse = store.nodes()["n1"]["refuse"]
    assert needle in refuse and "GPU 0" in refuse, refuse
    assert h.status() == "placed"  # not run, not failed: the scheduler moves it
    assert nvml.mig_log == []
    assert json.loads(store.nodes()["n1"]["gpus"])[0]["source"] == "nvml"
