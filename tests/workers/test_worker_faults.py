"""Fault injection with real processes: ``kill -9`` of a real-command worker whose job spawns a
grandchild leaves no job process running, and no attempt overlaps the next one."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

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
    wait_for,
    write_pool,
)
from tests.workers.test_process import alive

# Attempt 1 starts a grandchild in its own session that ignores SIGTERM, writes both pids and
# sleeps; a later attempt records when it started and succeeds.
JOB = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    out = os.path.join(sys.argv[1], os.environ["SNUGFIT_JOB_ID"])
    if os.environ["SNUGFIT_ATTEMPT"] != "1":
        with open(out + ".start", "w") as fh:
            fh.write(repr(time.time()))
        sys.exit(0)
    kid = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                            "signal.signal(15, signal.SIG_IGN); time.sleep(300)"],
                           start_new_session=True)
    with open(out + ".tmp", "w") as fh:
        json.dump([os.getpid(), kid.pid], fh)
    os.replace(out + ".tmp", out + ".json")
    time.sleep(300)
    """
)


@pytest.mark.parametrize("kills", [pytest.param(10, marks=pytest.mark.slow), 2])
def test_kill_9_of_a_worker_leaves_no_job_process_and_no_overlap(
    private_url: str,  # noqa: F811
    tmp_path: Path,
    procs: list,
    kills: int,
) -> None:
    nodes = [{"name": "n1", "gpu": "H100-80GB", "count": kills}]
    pool = Pool.from_dict({"name": "one", "nodes": nodes})
    pool_file = write_pool(tmp_path, {"name": "one", "nodes": nodes})
    store = RedisStore(redis.Redis.from_url(private_url))
    client = Client(store=store)
    svc = SchedulerService(store, pool)
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    worker = ["worker", "--node", "n1", "--pool", str(pool_file)]
    dead_at: dict[str, float] = {}
    for k in range(kills):
        h = client.submit(spec(k, [sys.executable, "-c", JOB, str(out)]))
        svc.step()
        assert h.status() == "placed", h.reason
        victim = snugfit([*worker, "--lease", "1.5", "--heartbeat", "0.2"], private_url, home)
        procs.append(victim)
        pidfile = out / f"{h.id}-a1.json"
        wait_for(pidfile.exists, 60, f"{h.id} attempt 1 and its grandchild to start")
        job_pids = json.loads(pidfile.read_text())
        assert all(alive(p) for p in job_pids)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        t_kill = time.monotonic()
        wait_for(lambda: not any(alive(p) for p in job_pids), 2.0, "the job's processes to die")  # noqa: B023
        assert time.monotonic() - t_kill <= 2.0
        dead_at[h.id] = time.time()
    # Each job is reclaimed (its lease lapsed) and placed again; a later victim may already
    # have run some of them.
    jobs = client.jobs()

    def all_replaced() -> bool:
        svc.step()
        return all(
            j.status() == "succeeded" or (j.placement is not None and j.placement.attempt >= 2)
            for j in jobs
        )

    wait_for(all_replaced, 60, "every job to be placed again")
    rescuer = snugfit([*worker, "--heartbeat", "0.1", "--burst"], private_url, home)
    procs.append(rescuer)
    assert rescuer.wait(timeout=120) == 0
    for j in jobs:
        assert j.status() == "succeeded", j.reason
        later = list(out.glob(f"{j.id}-a*.start"))
        assert later, f"{j.id}: no later attempt ran"
        # Every later attempt began after each attempt-1 process had died: no overlap.
        assert all(float(f.read_text()) > dead_at[j.id] for f in later)
    starts = [(e["job_id"], e["attempt"]) for _, e in store.events() if e["event"] == "started"]
    assert len(starts) == len(set(starts))  # one run per attempt
    assert {(j.id, 1) for j in jobs} <= set(starts)
