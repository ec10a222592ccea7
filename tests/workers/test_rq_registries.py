"""RQ tells the truth about what runs: a real worker process, real commands, real Redis.

An RQ job stays in the StartedJobRegistry while its snugfit run lasts, the worker shows busy,
and the job ends finished, failed or canceled with the run's outcome.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import (
    CanceledJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import queue_name, rq_job_id
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import wait_for
from tests.scheduler.service.test_faults import snugfit, write_pool
from workers._rq_worker import rq_outcome

POOL = {"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 4}]}


def _waits_for(path: Path, code: int) -> list[str]:
    """A command that runs until ``path`` exists, then exits with ``code``."""
    src = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(path)!r}):\n"
        "    time.sleep(0.02)\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", src]


def test_rq_registries_follow_the_run(
    tmp_path: Path,
    redis_url: str,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    conn = redis.Redis.from_url(redis_url)
    store = RedisStore(conn)
    client = Client(store=store)
    go = tmp_path / "go"
    ok = client.submit(spec("ok", _waits_for(go, 0)))
    bad = client.submit(spec("bad", _waits_for(go, 3)))
    stopped = client.submit(spec("stop", _waits_for(tmp_path / "never", 0)))
    handles = (ok, bad, stopped)
    svc = SchedulerService(store, Pool.from_dict(POOL))
    svc.step()
    assert [h.status() for h in handles] == ["placed"] * 3

    args = ["worker", "--node", "n1", "--pool", str(write_pool(tmp_path, POOL))]
    procs.append(snugfit([*args, "--heartbeat", "0.1"], redis_url, tmp_path / "home"))
    wait_for(lambda: all(h.status() == "running" for h in handles), 60, "all three to run")

    q = Queue(queue_name("n1"), connection=conn, serializer=JSONSerializer)
    started, finished = StartedJobRegistry(queue=q), FinishedJobRegistry(queue=q)
    failed, canceled = FailedJobRegistry(queue=q), CanceledJobRegistry(queue=q)
    rq_ids = {h.id: rq_job_id(h.id, 1) for h in handles}

    def status(jid: str) -> str:
        got = Job.fetch(rq_ids[jid], connection=conn, serializer=JSONSerializer).get_status()
        return str(getattr(got, "value", got))

    # While the runs last: started, in the StartedJobRegistry, and the worker is busy.
    assert set(started.get_job_ids()) == set(rq_ids.values())
    assert {status(j) for j in rq_ids} == {"started"}
    assert finished.get_job_ids() == [] and failed.get_job_ids() == []
    workers = Worker.all(queue=q)
    assert [w.get_state() for w in workers] == ["busy"]

    # A cancelled run ends canceled, never finished.
    assert stopped.cancel() == "requested"
    wait_for(lambda: rq_ids["job-stop"] in canceled.get_job_ids(), 60, "the cancel to reach RQ")
    assert status("job-stop") == "canceled"
    assert stopped.status() == "cancelled"
    assert set(started.get_job_ids()) == {rq_ids["job-ok"], rq_ids["job-bad"]}
    assert [w.get_state() for w in Worker.all(queue=q)] == ["busy"]  # two still run

    go.touch()
    wait_for(lambda: started.get_job_ids() == [], 60, "both runs to end in RQ")
    assert finished.get_job_ids() == [rq_ids["job-ok"]]
    assert failed.get_job_ids() == [rq_ids["job-bad"]]
    assert status("job-ok") == "finished" and status("job-bad") == "failed"
    assert ok.status() == "succeeded" and bad.status() == "failed"
    bad_rq = Job.fetch(rq_ids["job-bad"], connection=conn, serializer=JSONSerializer)
    assert bad_rq.latest_result() is not None
    assert "exit code 3" in str(bad_rq.latest_result().exc_string)  # type: ignore[union-attr]
    states = lambda: [w.get_state() for w in Worker.all(queue=q)]  # noqa: E731
    wait_for(lambda: states() == ["idle"], 30, "the worker to show idle")


def test_every_run_outcome_maps_to_an_rq_status() -> None:
    assert rq_outcome({"status": "succeeded"}) == (JobStatus.FINISHED, "")
    assert rq_outcome({"status": "cancelled"})[0] == "canceled"
    assert rq_outcome({"status": "skipped", "reason": "job is cancelled"})[0] == "canceled"
    assert rq_outcome({"status": "skipped", "reason": "stale attempt"})[0] == JobStatus.FINISHED
    assert rq_outcome({"status": "skipped", "reason": "missing"})[0] == JobStatus.FAILED
    for status in ("failed", "oom", "lost", "invalid"):
        assert rq_outcome({"status": status, "reason": "x"})[0] == JobStatus.FAILED
    assert rq_outcome(None)[0] == JobStatus.FAILED
