"""A multi-node gang that runs out of memory, on real Redis with real worker processes: the
rank that OOMs requeues the gang by the single-node OOM rule (scheduler.core.escalation), so
the retry reserves more per GPU than the type it died on holds and is placed as a gang on a
bigger type, which finishes; where no bigger type holds the gang it fails at once."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import redis

from scheduler.core.pool import Pool
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
from tests.workers.gang_helpers import node_worker
from tests.workers.test_process import alive
from tests.workers.test_worker import drain

H100 = [{"name": f"h{k}", "gpu": "H100-80GB", "count": 2, "rack": "r0"} for k in (1, 2)]
H200 = [{"name": f"g{k}", "gpu": "H200-141GB", "count": 2, "rack": "r1"} for k in (1, 2)]

# Writes its rendezvous environment to <out>/<attempt>-<NODE_RANK>.json. In attempt 1 rank 1
# runs out of CUDA memory at once and rank 0 sleeps (until its worker stops it); attempt 2
# succeeds.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    out = sys.argv[1]
    a, r = os.environ["SNUGFIT_ATTEMPT"], os.environ["NODE_RANK"]
    with open(os.path.join(out, f"{a}-{r}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
    if a == "1" and r == "1":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        sys.exit(1)
    if a == "1" and r == "0":
        time.sleep(60)
    """
)


def _gang(command: list[str], **kw: Any) -> dict[str, Any]:
    return spec("oom", command, n_gpus=4, tensor_parallel=2, **kw)


def test_a_gang_rank_oom_requeues_the_gang_on_a_bigger_type_and_it_finishes(
    private_url: str,  # noqa: F811
    tmp_path: Path,
    procs: list,
) -> None:
    nodes = H100 + H200
    pool = Pool.from_dict({"name": "two-types", "nodes": nodes})
    store = RedisStore(redis.Redis.from_url(private_url))
    svc = SchedulerService(store, pool)
    h = Client(store=store).submit(_gang([sys.executable, "-c", JOB, str(tmp_path)]))
    svc.step()
    p = h.placement
    assert p is not None and p.gang is not None and p.gpu_type == "H100-80GB"
    rank0, rank1 = p.gang[0].node, p.gang[1].node
    # Rank 0 runs in its own worker process and sleeps; rank 1 runs out of memory here.
    pool_file = write_pool(tmp_path, {"name": "two-types", "nodes": nodes})
    w0 = snugfit(
        ["worker", "--node", rank0, "--pool", str(pool_file), "--heartbeat", "0.1", "--burst"],
        private_url,
        tmp_path / "home",
    )
    procs.append(w0)
    started = tmp_path / "1-0.json"
    wait_for(started.exists, 60, "rank 0 of attempt 1 to start")
    wait_for(lambda: b"}" in started.read_bytes(), 10, "rank 0's record")
    pid0 = json.loads(started.read_text())["pid"]
    drain(node_worker(store, tmp_path, rank1, pool))
    rec = h.record()
    assert h.status() == "pending" and rec["ooms"] == "1", h.reason
    # The single-node rule: all of an H100's 80 GiB was not enough, so the retry reserves
    # past it, per GPU, on every rank.
    assert float(rec["reserved_gib"]) > 80.0
    assert h.reason.startswith(f"gang rank 1 of 2 on {rank1} (every rank stopped): CUDA OOM on")
    assert "bigger slot" in h.reason
    assert store.alloc_ids() == []
    # The other rank is stopped and its outcome discarded.
    wait_for(lambda: not alive(pid0), 20, "rank 0 to be stopped")
    assert w0.wait(timeout=60) == 0
    events = [e for _, e in store.events() if e["job_id"] == h.id]
    assert any(e["event"] == "oom" and e["node"] == rank1 for e in events)
    # Placed again as a gang of H200s (the only type that holds 80+ GiB per GPU), which ends.
    svc.step()
    p2 = h.placement
    assert p2 is not None and p2.attempt == 2 and p2.n_nodes == 2
    assert p2.gpu_type == "H200-141GB" and p2.reserved_gib > 80.0
    for r in p2.gang or []:
        drain(node_worker(store, tmp_path, r.node, pool))
    assert h.status() == "succeeded", h.reason
    assert (tmp_path / "2-0.json").exists() and (tmp_path / "2-1.json").exists()


def test_a_gang_oom_on_the_largest_type_fails_at_once(redis_url: str, tmp_path: Path) -> None:
    pool = Pool.from_dict({"name": "h100s", "nodes": H100})
    store = RedisStore(redis.Redis.from_url(redis_url))
    svc = SchedulerService(store, pool)
    h = Client(store=store).submit(_gang([sys.executable, "-c", JOB, str(tmp_path)]))
    svc.step()
    p = h.placement
    assert p is not None and p.gang is not None
    # Rank 1 OOMs first; nothing in this pool is bigger than an H100, so no retry is burnt.
    drain(node_worker(store, tmp_path, p.gang[1].node, pool))
    assert h.status() == "failed", h.reason
    assert "nothing bigger exists" in h.reason and h.reason.startswith("gang rank 1 of 2")
    assert store.alloc_ids() == []
