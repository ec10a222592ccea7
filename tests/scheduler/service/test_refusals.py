"""The leader places nothing on a node whose worker refuses work, and says why."""

from __future__ import annotations

import time

import redis

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec

POOL = Pool.from_dict(
    {
        "name": "two",
        "nodes": [
            {"name": "n1", "gpu": "H100-80GB", "count": 1},
            {"name": "n2", "gpu": "H200-141GB", "count": 1},
        ],
    }
)


def _refusing(svc: SchedulerService) -> dict[str, str]:
    return {n: st.refuse for n, st in svc.node_watch.statuses.items() if st.refuse}


def test_refusing_node_gets_no_placements_until_it_clears(redis_url: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    store.register_node(
        "n1", {"heartbeat_at": str(time.time()), "refuse": "MPS: daemon cannot start"}
    )
    svc = SchedulerService(store, POOL)
    svc.node_watch.check_s = 0.0
    client = Client(store=store)
    first = client.submit(spec(0, gpu=None))
    svc.step()
    assert first.placement is not None and first.placement.node == "n2"
    assert _refusing(svc) == {"n1": "MPS: daemon cannot start"}
    second = client.submit(spec(1))
    svc.step()
    assert second.status() == "pending"  # n2 is full and n1 refuses
    store.register_node("n1", {"heartbeat_at": str(time.time()), "refuse": ""})
    svc.step()
    assert second.placement is not None and second.placement.node == "n1"
    assert _refusing(svc) == {}


def test_snugfit_pool_shows_why_a_node_refuses_work(redis_url: str) -> None:
    import json

    from click.testing import CliRunner

    from scheduler.cli.ops import pool_command

    store = RedisStore(redis.Redis.from_url(redis_url))
    SchedulerService(store, POOL).step()  # the leader stores the pool
    why = "MIG: GPU 0: MIG mode is off; enable it"
    store.register_node("n1", {"heartbeat_at": "0", "refuse": why})
    store.register_node("n2", {"heartbeat_at": "0", "refuse": ""})
    text = CliRunner().invoke(pool_command, ["--url", redis_url, "--width", "200"])
    assert text.exit_code == 0, text.output
    assert f"node n1 refuses work: {why}" in text.output and "node n2 refuses" not in text.output
    data = json.loads(CliRunner().invoke(pool_command, ["--url", redis_url, "--json"]).output)
    assert data["nodes_refusing"] == {"n1": why}
