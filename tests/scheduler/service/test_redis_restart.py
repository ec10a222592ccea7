"""Redis restarts: the scheduler and the workers ride them out, no acknowledged job is lost, and
a placed job whose RQ job is missing is re-enqueued at the next step (real processes, a private
redis-server with AOF on a loopback port, SIGKILLed and restarted under a stream of submits)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import TERMINAL_STATES, rq_job_id
from scheduler.service.store.records import PlacementRecord
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.jobs import submit_stream
from tests.scheduler.service.test_faults import (
    TWO_NODES,
    _free_port,
    _ping,
    snugfit,
    wait_for,
    write_pool,
)

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs a redis-server binary"
)


class _Server:
    """A private redis-server with AOF (fsync always), restartable on the same port."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = _free_port()
        self.args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(lambda: _ping(self.port), 20, "redis-server")

    def crash(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def _orphans(store: RedisStore) -> list[str]:
    """Placed jobs whose RQ job is missing."""
    out = []
    for jid in store.job_ids("placed"):
        raw = store.get_fields([jid], ["placement"])[0][0]
        try:
            p = PlacementRecord.model_validate_json(raw or "")
        except ValueError:
            continue
        if not store.raw.exists(f"rq:job:{rq_job_id(jid, p.attempt)}"):
            out.append(jid)
    return out


def _why_stuck(store: RedisStore, ids: list[str]) -> str:
    rows = store.get_fields(ids, ["state", "placement"])
    stuck = [(j, r) for j, r in zip(ids, rows, strict=True) if r[0] not in TERMINAL_STATES]
    jid, (state, raw) = stuck[0]
    if raw is None:
        return f"{len(stuck)} unfinished, e.g. {jid} {state}"
    p = PlacementRecord.model_validate_json(raw)
    rid = rq_job_id(jid, p.attempt)
    qk = f"rq:queue:snugfit:node:{p.node}"
    status = store.raw.hget(f"rq:job:{rid}", "status")
    return (
        f"{len(stuck)} unfinished, e.g. {jid} {state} attempt {p.attempt} on {p.node}: RQ "
        f"status {status!r}, in queue at {store.raw.lpos(qk, rid)}, in the intermediate list "
        f"at {store.raw.lpos(qk + ':intermediate', rid)}"
    )


def test_every_step_re_enqueues_a_placed_job_whose_rq_job_is_missing(redis_url: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    client = Client(store=store)
    svc = SchedulerService(store, Pool.from_dict(TWO_NODES))
    handles = client.submit_many([spec(i) for i in range(3)])
    svc.step()
    assert all(h.status() == "placed" for h in handles)
    # Lost between commit and enqueue (a failed enqueue, or a restart that lost the write).
    for h in handles[:2]:
        assert h.placement is not None
        store.raw.delete(f"rq:job:{rq_job_id(h.id, h.placement.attempt)}")
    assert len(_orphans(store)) == 2
    svc.step()  # the same leader, no takeover: the step itself checks
    assert _orphans(store) == []


def test_the_server_side_rq_check_clears_only_jobs_whose_rq_job_it_found(redis_url: str) -> None:
    store = RedisStore(redis.Redis.from_url(redis_url))
    svc = SchedulerService(store, Pool.from_dict(TWO_NODES))
    handles = Client(store=store).submit_many(
        [spec(i) for i in range(3)] + [spec("x", id="odd id/1")]
    )
    svc.step()
    ids = [h.id for h in handles]
    assert store.maybe_unenqueued(ids) == ["odd id/1"]  # sanitised RQ ids: left to Python
    lost, odd = handles[0], handles[1]
    assert lost.placement is not None
    store.raw.delete(f"rq:job:{rq_job_id(lost.id, lost.placement.attempt)}")
    store.raw.hset(store.keys.job(odd.id), "attempt", "01")  # not canonical: left to Python
    assert store.maybe_unenqueued(ids) == [lost.id, odd.id, "odd id/1"]
    assert store.maybe_unenqueued([]) == []


def test_run_survives_redis_going_away_and_resigns_quietly(tmp_path: Path) -> None:
    server = _Server(tmp_path)
    server.start()
    try:
        store = RedisStore(redis.Redis.from_url(server.url, socket_timeout=1))
        svc = SchedulerService(store, Pool.from_dict(TWO_NODES), poll_s=0.02)
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                svc.run(stop)
            except BaseException as exc:  # the test fails on any exit but the stop
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        wait_for(lambda: store.leader() == svc.token, 20, "leadership")
        server.crash()  # idle: the scheduler sits in the wake-up BLPOP
        time.sleep(1.0)
        assert t.is_alive()
        server.start()
        client = Client(store=RedisStore(redis.Redis.from_url(server.url)))
        h = client.submit(spec(0))
        wait_for(lambda: h.status() == "placed", 30, "a placement after the restart")
        server.crash()
        stop.set()  # resign() meets a dead Redis on the way out: it must not raise
        t.join(30)
        assert not t.is_alive() and errors == []
    finally:
        server.stop()


def test_five_redis_restarts_under_submissions(
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    server = _Server(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    server.start()
    try:
        pool_file = write_pool(tmp_path, TWO_NODES)
        home = tmp_path / "home"
        url = server.url
        sched = snugfit(
            ["scheduler", "--pool", str(pool_file), "--simulated", "--lease-ttl", "2"], url, home
        )
        procs.append(sched)
        workers = []
        for node in ("n1", "n2"):
            args = ["worker", "--node", node, "--pool", str(pool_file), "--simulate"]
            args += ["--time-scale", "0.0005", "--heartbeat", "0.2", "--node-heartbeat", "0.5"]
            workers.append(snugfit(args, url, home))
        procs.extend(workers)
        store = RedisStore(redis.Redis.from_url(url))
        wait_for(lambda: set(store.nodes()) == {"n1", "n2"}, 60, "workers to register")

        acked: list[str] = []
        stop = threading.Event()

        t = threading.Thread(
            target=submit_stream, args=(url, stop, acked), kwargs={"batch": 3, "pause_s": 0.05}
        )
        t.start()
        recovery_s: list[float] = []
        try:
            for _ in range(5):
                n = len(acked)
                wait_for(lambda n=n: len(acked) >= n + 9, 60, "submissions")  # type: ignore[misc]
                server.crash()
                time.sleep(0.3)
                server.start()
                back = time.monotonic()
                wait_for(lambda: not _orphans(store), 30, "placed jobs to have RQ jobs")
                recovery_s.append(time.monotonic() - back)
        finally:
            stop.set()
            t.join()
        # Everything acknowledged is there and runs to the end.
        present = set(store.job_ids())
        missing = [j for j in acked if j not in present]
        assert not missing, f"{len(missing)} acknowledged jobs lost, e.g. {missing[:3]}"

        def all_done() -> bool:
            rows = store.get_fields(acked, ["state"])
            return all(r[0] in TERMINAL_STATES for r in rows)

        try:
            wait_for(all_done, 60, "every acknowledged job to finish")
        except AssertionError:
            raise AssertionError(_why_stuck(store, acked)) from None
        states = {r[0] for r in store.get_fields(acked, ["state"])}
        assert states == {"succeeded"}, states
        for p in (sched, *workers):
            if p.poll() is not None:
                err = p.stderr.read().decode()[-3000:] if p.stderr else ""
                raise AssertionError(f"{p.args[3:6]} exited ({p.returncode}): {err}")
        # "No job stays placed without an RQ job for more than a step after Redis is back":
        # the scheduler's backoff is at most 2 s, then one step re-enqueues.
        assert max(recovery_s) < 5.0, recovery_s
        print(f"{len(acked)} acknowledged jobs, orphan-free after restarts in {recovery_s} s")
    finally:
        server.stop()


def test_a_large_placed_backlog_is_checked_a_slice_at_a_time_and_fully(redis_url: str) -> None:
    from scheduler.core.synthetic import synthetic_pool
    from scheduler.service import _takeover

    store = RedisStore(redis.Redis.from_url(redis_url))
    svc = SchedulerService(store, synthetic_pool(1024, seed=0), placement_lease_s=1e9)
    n = 3 * _takeover._RECOVER_SLICE
    handles = Client(store=store).submit_many([spec(i) for i in range(n)])
    while store.count("placed") < n:
        assert svc.step().placed > 0
    for h in handles:
        assert h.placement is not None
        store.raw.delete(f"rq:job:{rq_job_id(h.id, h.placement.attempt)}")
    assert len(_orphans(store)) == n
    now, sweeps = 1e9, 0
    while _orphans(store) and sweeps < 4 * n // _takeover._RECOVER_SLICE:
        now += 1.0 / _takeover._RECOVER_SLICES_PER_S
        svc._check_enqueued(now)
        left = len(_orphans(store))
        assert left >= n - (sweeps + 1) * 2 * _takeover._RECOVER_SLICE  # a slice per call
        sweeps += 1
    assert _orphans(store) == []
