"""A real torchrun rendezvous across two gang nodes on one machine (CPU, gloo): each node's
worker starts `torchrun` with the environment snugfit gives its rank, the four processes meet
at node 0's address and port, and one all-reduce sums their ranks. Slow: it imports torch."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.scheduler.service.test_faults import (  # noqa: F401 (fixtures)
    private_url,
    snugfit,
    write_pool,
)
from tests.workers.test_worker import drain
from workers.worker import NodeWorker

pytestmark = pytest.mark.slow

# Node names are the hosts' names: both resolve to this machine.
NODES = [
    {"name": "127.0.0.1", "gpu": "H100-80GB", "count": 2},
    {"name": "localhost", "gpu": "H100-80GB", "count": 2},
]
POOL = Pool.from_dict({"name": "loop", "nodes": NODES})

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
           "node_rank": os.environ["GROUP_RANK"], "local_rank": os.environ["LOCAL_RANK"]}
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    """
)


def test_torchrun_ranks_on_two_gang_nodes_meet_and_all_reduce(
    private_url: str,  # noqa: F811
    tmp_path: Path,
    procs: list[Any],
) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [
        torchrun,
        "--nnodes", "$NNODES", "--node-rank", "$NODE_RANK",
        "--nproc-per-node", "$LOCAL_WORLD_SIZE",
        "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT",
        str(script), str(tmp_path),
    ]  # fmt: skip
    # The worker passes argv, never a shell: a shell here expands the rank's variables.
    argv = ["/bin/sh", "-c", "exec " + " ".join(command)]
    store = RedisStore(redis.Redis.from_url(private_url))
    h = Client(store=store).submit(spec("ddp", argv, gpu="H100-80GB", n_gpus=4))
    SchedulerService(store, POOL).step()
    p = h.placement
    assert p is not None and p.gang is not None
    pool_file = write_pool(tmp_path, {"name": "loop", "nodes": NODES})
    w0 = snugfit(
        ["worker", "--node", p.gang[0].node, "--pool", str(pool_file), "--heartbeat", "0.2",
         "--burst"],
        private_url,
        tmp_path / "home",
    )  # fmt: skip
    procs.append(w0)
    worker = NodeWorker(
        store,
        p.gang[1].node,
        heartbeat_s=0.2,
        pool=POOL,
        simulate=False,
        nvml=None,
        history_path=tmp_path / "h.jsonl",
        log_path=tmp_path / "log.jsonl",
    )
    drain(worker)
    assert w0.wait(timeout=120) == 0
    assert h.status() == "succeeded", (h.reason, h.logs()[-2000:])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["world"] == 4 and r["sum"] == 6.0 for r in ranks)
    assert sorted((r["node_rank"], r["local_rank"]) for r in ranks) == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")
    ]  # fmt: skip
