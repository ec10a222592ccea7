"""CPU cores and host memory through the live leader on real Redis: the Lua commit counts them
per node, a job refused for CPU says so, and finishing gives the cores back."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.protocol import Commit
from scheduler.service.store.records import dumps
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.scheduler.service._ledger import assert_ledger_matches_allocations

POOL = {
    "name": "cpu",
    "nodes": [
        {"name": "b200-0", "gpu": "B200-180GB", "count": 8},  # DGX B200: 112 cores, 2 TiB
        {"name": "h100-0", "gpu": "H100-80GB", "count": 8},
    ],
}


def _node_counters(store: RedisStore) -> dict[str, int]:
    return {k: v for k, v in store.gpu_state().items() if k.startswith("n")}


def test_job_refused_for_cpu_live_says_which_resource_it_lacked(store: RedisStore) -> None:
    pool = Pool.from_dict(POOL)
    client = Client(store=store)
    svc = SchedulerService(store, pool)
    hog = client.submit(spec("hog", gpu="B200-180GB", cpus=96))
    svc.step()
    assert hog.placement is not None and hog.placement.node == "b200-0"
    assert hog.placement.cpus == 96
    assert _node_counters(store)["n0:cpu"] == 96_000
    # Unpinned: the B200 option loses on CPUs (seven B200s idle, 16 cores free) and the job
    # goes to an H100; the stored decision says why the B200 lost.
    moved = client.submit(spec("moved", cpus=24))
    # Pinned to B200: nothing else will do, so it waits.
    stuck = client.submit(spec("stuck", gpu="B200-180GB", cpus=24))
    # More cores than any node has: rejected at once, with the reason in Redis.
    huge = client.submit(spec("huge", cpus=300))
    svc.step()
    assert moved.placement is not None and moved.placement.node == "h100-0"
    assert moved.decision is not None
    reasons = {o["gpu_type"]: o["reason"] for o in moved.decision["options"]}
    assert reasons["B200-180GB"] == "B200-180GB: needs 24 CPUs, 16 free on b200-0"
    assert stuck.status() == "pending"
    pending = [d for d in svc.core.tick(time.time()) if d.job_id == "job-stuck"]
    assert pending and pending[0].reason.startswith(
        "waiting: B200-180GB: needs 24 CPUs, 16 free on b200-0"
    )
    assert huge.status() == "rejected"
    assert "B200-180GB: needs 300 CPUs; no B200-180GB node has that many (b200-0 has 112)" in (
        huge.reason
    )
    svc.assert_consistent()
    assert_ledger_matches_allocations(store)
    # The hog finishes: its cores come back and the pinned job starts on the B200 node.
    assert store.start("job-hog", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-hog", 1, "succeeded", "{}", "done") == "ok"
    svc.step()
    assert stuck.placement is not None and stuck.placement.node == "b200-0"
    assert _node_counters(store)["n0:cpu"] == 24_000
    assert_ledger_matches_allocations(store)


def test_snugfit_pool_and_explain_show_cpus_and_host_memory(
    store: RedisStore, redis_url: str
) -> None:
    from scheduler.cli.ops import explain_command, pool_command

    client = Client(store=store)
    svc = SchedulerService(store, Pool.from_dict(POOL))
    client.submit(spec("a", gpu="B200-180GB", cpus=96, host_memory_gib=1000))
    client.submit(spec("huge", cpus=300))
    svc.step()
    out = CliRunner().invoke(pool_command, ["--url", redis_url, "--width", "200"])
    assert out.exit_code == 0, out.output
    assert "CPU and host memory by node" in out.output
    [row] = [line for line in out.output.splitlines() if "b200-0" in line and "/112" in line]
    assert "96/112" in row and "1,000/2,048" in row
    data = json.loads(CliRunner().invoke(pool_command, ["--url", redis_url, "--json"]).output)
    b200 = next(r for r in data["host_by_node"] if r["node"] == "b200-0")
    assert b200["cpus_free"] == 16 and b200["host_free_gib"] == 1048
    text = CliRunner().invoke(explain_command, ["job-huge", "--url", redis_url, "--width", "250"])
    assert "needs 300 CPUs" in text.output
    text = CliRunner().invoke(explain_command, ["job-a", "--url", redis_url, "--width", "250"])
    assert "host: 96 CPUs and 1,000.0 GiB host memory on b200-0" in text.output


def test_lua_commit_refuses_cores_another_scheduler_took(store: RedisStore) -> None:
    """Two schedulers decide from the same stale view on different GPUs of one node: the
    GPUs do not clash, the cores do, and the commit script catches it."""
    pool = Pool.from_dict({"name": "one", "nodes": [POOL["nodes"][0]]})  # type: ignore[index]
    svc = SchedulerService(store, pool, window=0)
    svc.step()  # owns the pool in Redis
    Client(store=store).submit_many([spec(i) for i in range(3)])

    def alloc(gpu: int, cpu_milli: int, host_mib: int = 0) -> str:
        return dumps(
            {"attempt": 1, "kind": 0, "gpus": [gpu], "used_mib": 1000, "mig_mask": 0,
             "reserved_mib": 0, "cpu_milli": cpu_milli, "host_mib": host_mib, "option": {}}
        )  # fmt: skip

    res = store.commit(
        [
            Commit("job-0", 0, alloc(0, 60_000), "{}", "{}"),
            Commit("job-1", 0, alloc(1, 60_000), "{}", "{}"),  # 120 > 112 cores with job-0
            Commit("job-2", 0, alloc(2, 1000, host_mib=3 << 20), "{}", "{}"),  # 3 TiB > 2
        ],
        svc.token,
    )
    assert res[0].startswith("ok:")
    assert res[1] == "err:node 0 has 52000 millicores free, needs 60000"
    assert res[2] == f"err:node 0 has {2 << 20} MiB host memory free, needs {3 << 20}"
    assert sorted(store.allocations()) == ["job-0"]
    forged = dumps(
        {"attempt": 1, "kind": 0, "gpus": [3], "used_mib": 1000, "cpu_milli": -5, "option": {}}
    )
    assert store.commit([Commit("job-1", 0, forged, "{}", "{}")], svc.token)[0] == (
        "bad:cpu_milli is out of range"
    )
    # Releasing takes back exactly what the commit added.
    assert store.start("job-0", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-0", 1, "succeeded", "{}", "done") == "ok"
    assert _node_counters(store)["n0:cpu"] == 0 and _node_counters(store)["n0:host"] == 0
