"""A multi-node gang whose rank's node dies, with real worker processes on real Redis: the
surviving rank's worker keeps renewing the job's one lease, so only the node's liveness tells;
the leader requeues the gang once that node is down, the survivor is stopped, and the gang
runs again when two nodes are up."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

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

# Records its pid in <out>/<attempt>-<NODE_RANK>.json; attempt 1 sleeps (a rank waiting at a
# collective for its dead peer), attempt 2 ends at once.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    a, r = os.environ["SNUGFIT_ATTEMPT"], os.environ["NODE_RANK"]
    with open(os.path.join(sys.argv[1], f"{a}-{r}.json"), "w") as f:
        json.dump({"pid": os.getpid()}, f)
    if a == "1":
        time.sleep(120)
    """
)


def _pid(path: Path) -> int:
    wait_for(lambda: path.exists() and b"}" in path.read_bytes(), 60, f"{path.name} to start")
    return int(json.loads(path.read_text())["pid"])


def test_a_gang_with_a_rank_on_a_dead_node_is_requeued_and_its_survivor_stopped(
    private_url: str,  # noqa: F811
    tmp_path: Path,
    procs: list,
) -> None:
    store = RedisStore(redis.Redis.from_url(private_url))
    svc = SchedulerService(store, POOL, node_stale_s=2.0, node_check_s=0.0)
    h = Client(store=store).submit(
        spec("dead", [sys.executable, "-c", JOB, str(tmp_path)], n_gpus=4, tensor_parallel=2)
    )
    svc.step()
    p = h.placement
    assert p is not None and p.gang is not None and p.n_nodes == 2
    pool_file = write_pool(tmp_path, {"name": "two", "nodes": NODES})
    workers = {}
    for node in ("n1", "n2"):
        args = ["worker", "--node", node, "--pool", str(pool_file), "--heartbeat", "0.1"]
        workers[node] = snugfit(
            [*args, "--node-heartbeat", "0.2", "--burst"], private_url, tmp_path / f"home-{node}"
        )
        procs.append(workers[node])
    ranks = {r.node: r.node_rank for r in p.gang}
    pids = {node: _pid(tmp_path / f"1-{ranks[node]}.json") for node in ("n1", "n2")}
    svc.step()
    assert h.status() == "running"
    # n2 dies: its worker and the rank it ran, at once (kill -9). n1's worker keeps beating
    # the job's lease for its rank, which waits for ever.
    os.kill(workers["n2"].pid, signal.SIGKILL)
    os.kill(pids["n2"], signal.SIGKILL)
    workers["n2"].wait(timeout=10)
    wait_for(lambda: not alive(pids["n2"]), 10, "n2's rank to die")
    deadline = time.monotonic() + 30
    while h.status() == "running" and time.monotonic() < deadline:
        svc.step()
        time.sleep(0.2)
    assert h.status() == "pending", h.reason
    assert h.reason.startswith(f"gang rank {ranks['n2']} of 2 on n2 lost: ")
    assert "every rank stopped, gang requeued" in h.reason
    assert h.record()["gang"] == "1"  # a failed rank's retry, not a lost lease
    assert store.alloc_ids() == []
    # The survivor is stopped by its own worker (its next heartbeat answers "lost").
    wait_for(lambda: not alive(pids["n1"]), 30, "n1's rank to be stopped")
    assert workers["n1"].wait(timeout=60) == 0
    # One node up: the gang waits; n2 back: it runs again as attempt 2 and finishes.
    svc.step()
    assert h.status() == "pending"
    back = [node_worker(store, tmp_path, str(n["name"])) for n in NODES]
    for w in back:
        w.register()
    svc.step()
    p2 = h.placement
    assert p2 is not None and p2.attempt == 2 and p2.n_nodes == 2
    for w in back:
        drain(w)
    assert h.status() == "succeeded", h.reason
