"""Multi-node gangs on the workers, real Redis: each node's worker starts its share of the GPUs
with torchrun's rendezvous environment, simulated workers run gangs too, and a failing rank ends
the whole gang (its other ranks are stopped) and requeues it."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import redis

from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import wait_for
from tests.scheduler.service.test_faults import (  # noqa: F401 (fixtures)
    private_url,
    snugfit,
    write_pool,
)
from tests.workers.gang_helpers import NODES, POOL, node_worker
from tests.workers.test_process import alive
from tests.workers.test_worker import drain

# Writes its rendezvous environment to <out>/<attempt>-<NODE_RANK>.json, then: attempt 1 of
# rank 1 fails at once and attempt 1 of rank 0 sleeps (until its worker stops it); every
# other run succeeds.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    out, fail = sys.argv[1], sys.argv[2] == "fail"
    keys = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
            "NNODES", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "SNUGFIT_ATTEMPT"]
    env = {k: os.environ.get(k) for k in keys}
    env["pid"] = os.getpid()
    a, r = env["SNUGFIT_ATTEMPT"], env["NODE_RANK"]
    with open(os.path.join(out, f"{a}-{r}.json"), "w") as f:
        json.dump(env, f)
    if fail and a == "1" and r == "1":
        sys.exit(3)
    if fail and a == "1" and r == "0":
        time.sleep(60)
    """
)


def _gang(i: str, command: list[str] | None = None) -> dict[str, Any]:
    return spec(i, command, gpu="H100-80GB", n_gpus=4, tensor_parallel=2)


def test_each_rank_gets_torchrun_rendezvous_env_and_its_share(
    redis_url: str, tmp_path: Path
) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    h = Client(store=store).submit(_gang("env", [sys.executable, "-c", JOB, str(tmp_path), "ok"]))
    SchedulerService(store, POOL).step()
    p = h.placement
    assert p is not None and p.gang is not None and p.n_nodes == 2
    # Each node's worker runs its own RQ job; the first rank to end waits for the other.
    drain(node_worker(store, tmp_path, "n1"))
    assert h.status() == "running"
    drain(node_worker(store, tmp_path, "n2"))
    assert h.status() == "succeeded", h.reason
    envs = {r: json.loads((tmp_path / f"1-{r}.json").read_text()) for r in (0, 1)}
    for r in p.gang:
        env = envs[r.node_rank]
        assert env["MASTER_ADDR"] == p.gang[0].node == p.node
        assert env["MASTER_PORT"] == str(p.master_port)
        assert env["WORLD_SIZE"] == "4" and env["NNODES"] == "2"
        assert env["NODE_RANK"] == str(r.node_rank)
        assert env["RANK"] == str(2 * r.node_rank) and env["LOCAL_RANK"] == "0"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        # The node's own two GPUs, by their index on that node.
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert store.alloc_ids() == []
    g = store.gpu_state()
    assert all(g[f"{k}:used"] == 0 for k in range(4)) and g["n0:cpu"] == g["n1:cpu"] == 0


def test_simulated_workers_run_a_gang(redis_url: str, tmp_path: Path) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    h = Client(store=store).submit(_gang("sim"))
    SchedulerService(store, POOL).step()
    assert h.placement is not None and h.placement.n_nodes == 2
    drain(node_worker(store, tmp_path, "n2", simulate=True))
    assert h.status() == "running"
    drain(node_worker(store, tmp_path, "n1", simulate=True))
    assert h.status() == "succeeded", h.reason
    assert h.outcome is not None and h.outcome.simulated
    assert store.alloc_ids() == []


def test_a_failing_rank_stops_the_gang_and_requeues_it(
    private_url: str,  # noqa: F811
    tmp_path: Path,
    procs: list,
) -> None:
    store = RedisStore(redis.Redis.from_url(private_url))
    client = Client(store=store)
    svc = SchedulerService(store, POOL)
    h = client.submit(_gang("fail", [sys.executable, "-c", JOB, str(tmp_path), "fail"]))
    svc.step()
    p = h.placement
    assert p is not None and p.gang is not None
    rank0 = p.gang[0].node
    rank1 = p.gang[1].node
    # Rank 0 runs in its own worker process (RQ wants the main thread), and sleeps.
    pool_file = write_pool(tmp_path, {"name": "two", "nodes": NODES})
    home = tmp_path / "home"
    w0 = snugfit(
        ["worker", "--node", rank0, "--pool", str(pool_file), "--heartbeat", "0.1", "--burst"],
        private_url,
        home,
    )
    procs.append(w0)
    started = tmp_path / "1-0.json"
    wait_for(started.exists, 60, "rank 0 of attempt 1 to start")
    wait_for(lambda: started.stat().st_size > 0 and b"}" in started.read_bytes(), 10, "env")
    pid0 = json.loads(started.read_text())["pid"]
    assert alive(pid0)
    # Rank 1 fails here: the gang is requeued and every node's capacity comes back at once.
    drain(node_worker(store, tmp_path, rank1))
    assert h.status() == "pending"
    assert h.reason == (
        f"gang rank 1 of 2 on {rank1} failed (exit code 3); every rank was stopped and the "
        "gang requeued"
    )
    assert store.alloc_ids() == []
    # Rank 0's next heartbeat says the attempt is gone: its worker stops it and exits.
    wait_for(lambda: not alive(pid0), 20, "rank 0 to be stopped")
    assert w0.wait(timeout=60) == 0
    ends = [e for _, e in store.events() if e["job_id"] == h.id and e["event"] == "finished"]
    assert any(e["node"] == rank0 and "lease lost" in e["reason"] for e in ends)
    # Placed again as attempt 2, which both ranks finish.
    svc.step()
    p2 = h.placement
    assert p2 is not None and p2.attempt == 2 and p2.n_nodes == 2
    for node in ("n1", "n2"):
        drain(node_worker(store, tmp_path, node))
    assert h.status() == "succeeded", h.reason
    assert (tmp_path / "2-0.json").exists() and (tmp_path / "2-1.json").exists()
