"""Multi-node gangs through the live leader on real Redis: the Lua commit takes every node of
the gang at once (GPUs, CPUs and host memory), a gang waits while only one node is free, and
the leader enqueues one RQ job per node with its rank offset."""

from __future__ import annotations

import json
import time

import pytest

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import gang_finetune_spec
from tests.jobs import inference_spec as spec

POOL = {
    "name": "gang",
    "nodes": [
        {"name": "h100-0", "gpu": "H100-80GB", "count": 8, "rack": "r0"},
        {"name": "h100-1", "gpu": "H100-80GB", "count": 8, "rack": "r0"},
    ],
}


#: A 2 x 8 H100 gang: larger than either node, so it spans both.
GANG = {"gpu": "H100-80GB", "n_gpus": 16, "tensor_parallel": 8}


@pytest.fixture
def client(store: RedisStore) -> Client:
    return Client(store=store)


@pytest.fixture
def svc(store: RedisStore) -> SchedulerService:
    return SchedulerService(store, Pool.from_dict(POOL))


def _rq_jobs(store: RedisStore, node: str) -> list[str]:
    raw = store.raw.lrange(f"rq:queue:snugfit:node:{node}", 0, -1)
    return [x.decode() if isinstance(x, bytes) else str(x) for x in raw]


def test_16_gpu_gang_commits_on_both_nodes_and_is_refused_while_one_is_busy(
    store: RedisStore, client: Client, svc: SchedulerService
) -> None:
    one = client.submit(spec("one", gpu="H100-80GB"))
    svc.step()
    assert one.placement is not None
    big = client.submit(spec("big", **GANG))
    svc.step()
    # One GPU of one node is taken: a 2 x 8 gang cannot start, and the decision says so.
    assert big.status() == "pending"
    waiting = [d for d in svc.core.tick(time.time()) if d.job_id == "job-big"]
    assert waiting and (
        "needs 16 GPUs of H100-80GB across 2 nodes; only 1 node has 8 free" in waiting[0].reason
    )
    assert store.start("job-one", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-one", 1, "succeeded", "{}", "done") == "ok"
    svc.step()
    p = big.placement
    assert p is not None and p.n_nodes == 2 and p.label == "H100-80GB x16 (2 nodes)"
    assert p.gang is not None
    assert [(r.node, r.node_rank, r.rank_offset) for r in p.gang] == [
        (p.node, 0, 0),
        ("h100-1" if p.node == "h100-0" else "h100-0", 1, 8),
    ]
    assert sorted(g for r in p.gang for g in r.gpu_indices) == list(range(16))
    assert p.master_port is not None and 29500 <= p.master_port < 31500
    # The allocation took all 16 GPUs and each node's CPUs and memory, in one commit.
    g = store.gpu_state()
    assert all(g[f"{k}:used"] > 0 for k in range(16))
    alloc = json.loads(store.allocations()["job-big"])
    for k in (0, 1):
        assert g[f"n{k}:cpu"] == alloc["cpu_milli"] == g[f"n{k}:cpu_cap"]
        assert g[f"n{k}:host"] == alloc["host_mib"]
    # One RQ job per node, node 0's under the attempt's ordinary id.
    for r in p.gang:
        assert _rq_jobs(store, r.node)[-1] == r.rq_job_id
    assert p.gang[1].rq_job_id == f"{p.gang[0].rq_job_id}-n1"
    svc.assert_consistent()
    # Finishing gives every node back.
    assert store.start("job-big", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-big", 1, "succeeded", "{}", "done") == "ok"
    g = store.gpu_state()
    assert all(g[f"{k}:used"] == 0 for k in range(16))
    assert g["n0:cpu"] == g["n1:cpu"] == 0


def test_lua_commit_refuses_a_gang_when_one_of_its_nodes_lost_the_capacity(
    store: RedisStore, client: Client, svc: SchedulerService
) -> None:
    # Two leaders' views: a gang and a 1-GPU job on node 1 commit in the same chunk; the
    # second to be checked is refused and nothing of it is taken on either node.
    client.submit(spec("big", **GANG))
    svc.step()
    alloc = json.loads(store.allocations()["job-big"])
    # Forge a second gang on the same GPUs: the commit must refuse it whole.
    client.submit(spec("twin", **GANG))
    from scheduler.service.store.protocol import Commit
    from scheduler.service.store.records import dumps

    forged = dict(alloc, attempt=1)
    res = store.commit([Commit("job-twin", 0, dumps(forged), "{}", "{}")], "", fenced=False)
    assert res[0].startswith("err:GPU ")
    assert "job-twin" not in store.allocations()
    g = store.gpu_state()
    assert g["n0:cpu"] == g["n1:cpu"] == alloc["cpu_milli"]


def test_training_gang_carries_its_gradient_traffic_to_the_leader(store: RedisStore) -> None:
    pool = Pool.from_dict(POOL)
    client = Client(store=store)
    ft = {
        "id": "job-ft",
        "model": "llama-3.1-8b",
        "task": "full_finetune",
        "batch_size": 4,
        "seq_len": 2048,
        "steps": 100,
        "n_gpus": 16,
        "tensor_parallel": 8,
        "gpu": "H100-80GB",
    }
    h = client.submit(ft)
    request = json.loads(store.get_job("job-ft")["request"])
    steps, grad, dp, charged, act, micro = request["sync"]
    assert (steps, dp) == (100, 2) and grad > 0 and charged > 0
    # No pipeline here, but the activation figures travel for every training gang.
    assert act == 4 * 2048 * 4096 * 2 and micro == 1
    # Inference records stay as they were.
    client.submit(spec("inf"))
    assert "sync" not in json.loads(store.get_job("job-inf")["request"])
    svc = SchedulerService(store, pool)
    svc.step()
    p = h.placement
    assert p is not None and p.n_nodes == 2 and p.runtime_s is not None
    predicted = json.loads(store.get_job("job-ft")["predictions"])["H100-80GB"]["runtime_s"]
    # One 400 Gb/s link per node (the default) is slower than the predictor's link per GPU.
    assert p.runtime_s > predicted


def test_pipeline_gang_pays_its_activations_and_old_records_still_decode(
    store: RedisStore,
) -> None:
    from predictor.internode import GradientSync, internode_pipeline_s
    from scheduler.service._intake import InvalidRecord, decode_request

    pool = Pool.from_dict(POOL)
    pp = gang_finetune_spec(
        "job-pp", steps=100, gradient_accumulation=8, pipeline_parallel=2, gpu="H100-80GB"
    )
    h = Client(store=store).submit(pp)
    rec = store.get_job("job-pp")
    request = json.loads(rec["request"])
    # What the leader reads back is what the client computed: the spec's layout and figures.
    got = decode_request(pool, "job-pp", "pending", "0", "0", None, rec["request"]).sync
    steps, _, dp, charged, act, micro = request["sync"]
    assert got == GradientSync(steps, request["sync"][1], dp, charged, 2, 8, act, micro)
    SchedulerService(store, pool).step()
    p = h.placement
    assert p is not None and p.n_nodes == 2 and p.runtime_s is not None
    predicted = json.loads(rec["predictions"])["H100-80GB"]["runtime_s"]
    # One data-parallel replica (no all-reduce): the runtime is the prediction plus the two
    # stages' activations over one 400 Gb/s link.
    assert dp == 1 and charged == 0.0
    pipe = internode_pipeline_s(got, 8, 2, 400.0)
    assert pipe > 1.0  # seconds, over 100 steps
    # (the stored prediction is rounded to the millisecond)
    assert p.runtime_s == pytest.approx(predicted + pipe, abs=2e-3)
    # A record written before the activation figures existed decodes with none of them.
    old = json.dumps(request | {"sync": request["sync"][:4]})
    legacy = decode_request(pool, "job-pp", "pending", "0", "0", None, old).sync
    assert legacy.activation_bytes == 0.0 and legacy.pipeline_parallel == 2
    five = json.dumps(request | {"sync": [1] * 5})
    with pytest.raises(InvalidRecord, match="sync must be 4 or 6"):
        decode_request(pool, "x", "pending", "0", "0", None, five)


def test_snugfit_explain_and_pool_show_the_gang(store: RedisStore, redis_url: str) -> None:
    from click.testing import CliRunner

    from scheduler.cli.ops import explain_command, pool_command

    client = Client(store=store)
    svc = SchedulerService(store, Pool.from_dict(POOL))
    client.submit(spec("one", gpu="H100-80GB"))
    client.submit(spec("big", gpu="H100-80GB", n_gpus=16, tensor_parallel=8))
    svc.step()
    assert store.start("job-one", 1, "w", int(time.time() * 1000) + 60_000) == "ok"
    assert store.finish("job-one", 1, "succeeded", "{}", "done") == "ok"
    svc.step()
    text = CliRunner().invoke(explain_command, ["job-big", "--url", redis_url, "--width", "250"])
    assert text.exit_code == 0, text.output
    assert "H100-80GB x16 (2 nodes)" in text.output
    assert "+1 node[" in text.output
    assert "host: 112 CPUs and 2,048.0 GiB host memory on each of 2 nodes" in text.output
    data = json.loads(CliRunner().invoke(pool_command, ["--url", redis_url, "--json"]).output)
    rows = {r["node"]: r for r in data["host_by_node"]}
    assert rows["h100-0"]["jobs"] == rows["h100-1"]["jobs"] == 1
    assert rows["h100-0"]["cpus_free"] == rows["h100-1"]["cpus_free"] == 0


def test_a_new_leader_rebuilds_a_gang_from_redis(store: RedisStore) -> None:
    pool = Pool.from_dict(POOL)
    client = Client(store=store)
    first = SchedulerService(store, pool)
    big = client.submit(spec("big", **GANG))
    first.step()
    assert big.placement is not None and big.placement.n_nodes == 2
    first.resign()
    second = SchedulerService(store, pool)
    second.step()
    second.assert_consistent()
    held = second.core.state.option_of("job-big")
    assert held.n_nodes == 2 and sorted(held.gpu_indices) == list(range(16))
    assert int(second.core.state.node_cpu_milli.sum()) == 2 * 112_000


def test_a_gang_whose_other_rank_never_starts_is_requeued(store: RedisStore) -> None:
    pool = Pool.from_dict(POOL)
    big = Client(store=store).submit(spec("big", gpu="H100-80GB", n_gpus=16, tensor_parallel=8))
    # A placement lease of 0: every check is past it.
    svc = SchedulerService(store, pool, placement_lease_s=0.0)
    svc.step()
    p = big.placement
    assert p is not None and p.gang is not None
    lease = int(time.time() * 1000) + 60_000
    assert store.start("job-big", 1, "w0", lease, node_rank=0) == "ok"
    # The same rank twice from another worker is refused; rank 1 never comes.
    assert store.start("job-big", 1, "w9", lease, node_rank=0).startswith("rank 0 already")
    assert big.status() == "running"
    s = svc.step()
    assert s.reclaimed == 1
    assert big.record()["reason"] == (
        f"gang rank 1 on node {p.gang[1].node} never started 0 s after placement (is "
        f"`snugfit worker --node {p.gang[1].node}` running?); every rank stopped, gang requeued"
    )
    assert store.heartbeat("job-big", 1, lease) == "lost"  # rank 0's worker stops it
    # Placed again (with a zero lease, each step also reclaims the unstarted new attempt).
    svc.step()
    assert big.placement is not None and big.placement.attempt >= 2
    svc.assert_consistent()


def test_a_gang_whose_ranks_all_started_is_left_running(store: RedisStore) -> None:
    pool = Pool.from_dict(POOL)
    big = Client(store=store).submit(spec("big", gpu="H100-80GB", n_gpus=16, tensor_parallel=8))
    svc = SchedulerService(store, pool, placement_lease_s=0.0)
    svc.step()
    lease = int(time.time() * 1000) + 60_000
    for rank in (0, 1):
        assert store.start("job-big", 1, f"w{rank}", lease, node_rank=rank) == "ok"
    assert svc.step().reclaimed == 0
    assert big.status() == "running"
    assert store.gang_rank_done("job-big", 1, 1, 2) == "waiting"
    assert store.gang_rank_done("job-big", 1, 0, 2) == "last"
