"""A JobSpec's node_selector through the live path on real Redis: the client stores it in the
request record, the leader places the job only on a matching node, and a job no node matches
is rejected with the selector named."""

from __future__ import annotations

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec

POOL = {
    "name": "zones",
    "nodes": [
        {"name": "h100-a", "gpu": "H100-80GB", "count": 8, "labels": {"zone": "a"}},
        {"name": "h100-b", "gpu": "H100-80GB", "count": 8, "labels": {"zone": "b"}},
    ],
}


def test_node_selector_keeps_live_jobs_on_matching_nodes(store: RedisStore) -> None:
    client = Client(store=store)
    svc = SchedulerService(store, Pool.from_dict(POOL))
    jobs = [client.submit(spec(i, node_selector={"zone": "b"})) for i in range(3)]
    free = client.submit(spec("free"))
    nowhere = client.submit(spec("nowhere", node_selector={"zone": ["c"]}))
    svc.step()
    for j in jobs:
        assert j.placement is not None and j.placement.node == "h100-b"
    assert free.placement is not None
    assert nowhere.status() == "rejected"
    assert "no node matches node_selector zone in {c}" in (nowhere.reason or "")
    svc.assert_consistent()


def test_snugfit_pool_shows_node_labels(store: RedisStore, redis_url: str) -> None:
    import json

    from click.testing import CliRunner

    from scheduler.cli.ops import pool_command

    SchedulerService(store, Pool.from_dict(POOL)).step()
    out = CliRunner().invoke(pool_command, ["--url", redis_url, "--width", "200"])
    assert out.exit_code == 0, out.output
    [row] = [line for line in out.output.splitlines() if "h100-b" in line and "/112" in line]
    assert "zone=b" in row
    data = json.loads(CliRunner().invoke(pool_command, ["--url", redis_url, "--json"]).output)
    assert [r["labels"] for r in data["host_by_node"]] == [{"zone": "a"}, {"zone": "b"}]
