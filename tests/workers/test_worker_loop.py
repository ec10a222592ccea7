"""The node worker's own loop around RQ: it stops on SIGTERM, survives Redis errors, and puts
back RQ jobs stranded in RQ's intermediate list (real worker processes, real Redis)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import queue_name
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import Procs, wait_for
from tests.scheduler.service.test_faults import snugfit, write_pool

POOL = {"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]}


def _worker(tmp_path: Path, url: str) -> subprocess.Popen[bytes]:
    pool_file = write_pool(tmp_path, POOL)
    args = ["worker", "--node", "n1", "--pool", str(pool_file), "--simulate"]
    args += ["--time-scale", "0.001", "--heartbeat", "0.1", "--node-heartbeat", "0.2"]
    return snugfit(args, url, tmp_path / "home")


def test_idle_worker_stops_on_sigterm(
    tmp_path: Path, redis_url: str, store: RedisStore, procs: Procs
) -> None:
    w = _worker(tmp_path, redis_url)
    procs.append(w)
    wait_for(lambda: "n1" in store.nodes(), 60, "the worker to register")
    time.sleep(0.5)  # into RQ's blocking dequeue
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 0
    assert time.monotonic() - t0 < 10


def test_job_stranded_in_rq_intermediate_list_is_put_back_and_runs(
    tmp_path: Path, redis_url: str, store: RedisStore, procs: Procs
) -> None:
    client = Client(store=store)
    svc = SchedulerService(store, Pool.from_dict(POOL))
    h = client.submit(spec(0))
    svc.step()
    assert h.status() == "placed"
    # What a BLMOVE whose reply a Redis restart lost leaves behind.
    key = f"rq:queue:{queue_name('n1')}"
    assert store.raw.lmove(key, f"{key}:intermediate", "LEFT", "RIGHT") is not None
    w = _worker(tmp_path, redis_url)
    procs.append(w)
    wait_for(lambda: h.status() == "succeeded", 60, "the stranded job to run")
    assert h.placement is not None and h.placement.attempt == 1  # no retry, no re-placement
