"""Service benchmarks against a private real redis-server on loopback (no other traffic).

1. Throughput, submit -> enqueued on a worker queue: a client process submits ``--jobs`` jobs in
   batches (``Client.submit_many``, pipelined) while the scheduler runs in this process; the
   figure is jobs / (last RQ enqueue - first submit). Goal >= 5,000 jobs/s sustained. Beside
   it, the CPU each process spent per placed job over that window (leader and redis-server up
   to the end of the last step that placed; the submitter over its whole timed loop).
2. Placement latency at ``--rate`` jobs/s (one job per submit): per job, RQ's ``enqueued_at``
   minus the record's ``submitted_at``; p50/p99. Goal p99 <= 20 ms at 1,000 jobs/s. The rate
   the submitter really offered is recorded next to it. The submitter is a user's client: one
   ``Client.submit`` per job, on an absolute schedule; the timed submits start once its
   warm-up job is placed, so the leader's one-off first-placement cost (importing RQ once)
   is outside the window, as the client's own warm-up always was. Beside the figures: the CPU
   each process spent (submitter per submit, leader and redis-server per job) and the
   leader's garbage-collection pauses, since the three share this machine's cores. The run
   stays within the pool: ``--seconds`` defaults to 9 (9,000 jobs; the 8,192-GPU pool fills
   at about 9,770 of them, after which a job's wait is for capacity, not for placement), and
   jobs never placed are counted as ``unplaced``.
0. The physical reference: ``redis-benchmark -q -P 16 -t set`` against the same server, so a
   figure can be read against what this machine's Redis does at that moment (the ratio
   ``jobs_per_s / redis_set_per_s`` is recorded). The 1-minute load average is recorded
   beside every figure: the machine may be shared.

Submitters predict with the service's tiered predictor once and repeat the row (every job has
the same spec), so the figures are the client's Redis path and the scheduler, not LightGBM.
3. Scheduler RSS with ``--pending`` jobs pending (a one-GPU pool, so they stay pending): peak RSS
   of a separate scheduler process after several steps. Goal <= 300 MB.

Writes ``benchmarks/results/service.json``. Run: ``.venv/bin/python benchmarks/bench_service.py``
(``--quick`` for a smaller run; ``--only latency`` (repeatable: ``throughput``, ``latency``,
``rss``) runs only those parts, beside the redis reference, and writes
``service_<parts>.json`` instead). The machine's load is recorded with the results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import private_redis, write_result  # noqa: E402

from scheduler.core.pool import Pool  # noqa: E402
from scheduler.core.synthetic import synthetic_pool  # noqa: E402
from scheduler.service.client import Client  # noqa: E402
from scheduler.service.leader import SchedulerService  # noqa: E402
from scheduler.service.store.redis_store import RedisStore  # noqa: E402
from tests.jobs import inference_spec  # noqa: E402


def spec(i: int) -> dict[str, Any]:
    """Job ``b{i}``: the tests' small llama-3.1-8b inference job (every job the same shape)."""
    return inference_spec(i, id=f"b{i}")


def _same_shape_table_fn() -> Any:
    """The service's tiered predictor, run once: every benchmark job has the same spec, so its
    row is repeated. The scheduler's figures are what is measured; without this, one
    ``Client.submit`` spends ~35 ms in LightGBM and a single submitter cannot offer 200 jobs/s."""
    import dataclasses

    from predictor.spec import parse_spec
    from scheduler.service.client import default_table_fn

    one = default_table_fn()([parse_spec(spec(0))])
    fields = {f.name: getattr(one, f.name) for f in dataclasses.fields(one)}

    def table_fn(specs: Any) -> Any:
        n = len(specs)
        if n == 1:  # a one-job submit: the row as it is (its arrays are never written)
            return type(one)(**{**fields, "job_ids": (specs[0].id,)})
        return one.take(np.zeros(n, np.intp), tuple(s.id for s in specs))

    return table_fn


def _submitter(
    url: str, n: int, batch: int, rate: float | None, offset: int, cpu: Any = None
) -> None:
    """Submit ``n`` jobs: in batches (``Client.submit_many``), or at ``rate`` jobs/s one
    ``Client.submit`` each on an absolute schedule (submit ``i`` is due ``i / rate`` s after
    the first; one that is late goes at once, without a sleep). ``cpu``: a shared double
    that gets this process's CPU seconds (user + system) over the timed submits."""
    client = Client(url, table_fn=_same_shape_table_fn())
    warm = client.submit_many([spec(10**9 + offset)])[0]  # warm up outside the timing
    if rate is not None:
        # The leader warms up too: its first placement imports RQ and builds the RQ job
        # template, once. A latency run starts from a scheduler that has placed and
        # enqueued a job, or that one-off stall would be the first dozens of jobs' latency.
        _wait_enqueued(client, warm.id, timeout_s=60)
    c0 = time.process_time()
    if rate is None:
        for start in range(0, n, batch):
            client.submit_many([spec(offset + i) for i in range(start, min(n, start + batch))])
    else:
        t0 = time.perf_counter()
        for i in range(n):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            client.submit(spec(offset + i))
    if cpu is not None:
        cpu.value = time.process_time() - c0


def _wait_enqueued(client: Client, job_id: str, timeout_s: float) -> None:
    """Until ``job_id``'s RQ job exists (or ``timeout_s``)."""
    assert isinstance(client.store, RedisStore)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = client.store.get_fields([job_id], ["placement"])
        if rows[0][0] and _enqueued_at(client.store, [job_id]):
            return
        time.sleep(0.001)


def _enqueued_at(store: RedisStore, ids: list[str]) -> dict[str, float]:
    from rq.job import Job

    out: dict[str, float] = {}
    rows = store.get_fields(ids, ["placement", "submitted_at"])
    rq_ids = [json.loads(p)["rq_job_id"] for p, _ in rows if p]
    for job in Job.fetch_many(rq_ids, connection=store.raw):
        if job is not None and job.enqueued_at is not None:
            out[job.id] = job.enqueued_at.timestamp()
    return out


class _PlacingSteps:
    """Steps ``svc``, keeping the leader's and redis-server's CPU seconds at the end of the
    last step that placed a job. A throughput run's window ends with that step's last RQ
    enqueue; the steps after it (the pool is full: each computes the held head job's earliest
    fit) are outside it."""

    def __init__(self, svc: SchedulerService, store: RedisStore) -> None:
        self.svc, self.store = svc, store
        self.leader0, self.redis0 = time.process_time(), _redis_cpu_s(store)
        self.leader_s = self.redis_s = 0.0
        self.steps = 0

    def step(self) -> Any:
        s = self.svc.step()
        if s.placed:
            self.leader_s = time.process_time() - self.leader0
            self.redis_s = _redis_cpu_s(self.store) - self.redis0
            self.steps += 1
        return s


_Stepper = SchedulerService | _PlacingSteps


def run_until_enqueued(
    svc: _Stepper, store: RedisStore, n: int, timeout_s: float, proc: Any = None
) -> None:
    """Step until ``n`` jobs are placed, or the submitter is done and the pool is full."""
    deadline = time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline:
        s = svc.step()
        if store.count("placed") >= n:
            return
        submitting = proc is not None and proc.is_alive()
        idle = 0 if s.placed or s.ingested or submitting else idle + 1
        if idle >= 20:  # everything submitted, nothing placeable: the pool is full
            return
        if s.placed == 0:
            store.wait_wakeup(0.005)


def bench_throughput(url: str, n: int, pool: Pool) -> dict[str, Any]:
    store = RedisStore(__import__("redis").Redis.from_url(url))
    store.r.flushdb()
    # No workers in this benchmark: placed jobs must stay placed, not be reclaimed as unstarted.
    svc = SchedulerService(store, pool, window=5000, placement_lease_s=1e9)
    svc.step()
    cpu = mp.Value("d", float("nan"))
    proc = mp.Process(target=_submitter, args=(url, n, 1000, None, 0, cpu))
    meter = _PlacingSteps(svc, store)
    proc.start()
    run_until_enqueued(meter, store, n + 1, timeout_s=600, proc=proc)
    proc.join()
    ids = store.job_ids()
    subs = [float(x[0]) for x in store.get_fields(ids, ["submitted_at"]) if x[0]]
    enq = _enqueued_at(store, ids)
    placed = store.count("placed")
    first, last = min(subs), max(enq.values())
    return {
        "jobs": n,
        "placed_and_enqueued": placed,
        "wall_s": round(last - first, 3),
        "jobs_per_s": round(placed / (last - first), 1),
        "goal_jobs_per_s": 5000,
        # Where the two cores went over the window, per placed job (the submitter's figure
        # is its whole timed loop, which also submits the jobs the pool cannot hold).
        "cpu_ms_per_placed_job": {
            "leader": round(meter.leader_s / placed * 1000, 3),
            "redis": round(meter.redis_s / placed * 1000, 3),
            "submitter": round(cpu.value / placed * 1000, 3),
        },
        "leader_placing_steps": meter.steps,
        "load_avg_1m": _load(),
    }


def bench_latency(url: str, rate: float, seconds: float, pool: Pool) -> dict[str, Any]:
    import redis

    store = RedisStore(redis.Redis.from_url(url))
    store.r.flushdb()
    svc = SchedulerService(store, pool, window=5000, poll_s=0.005, placement_lease_s=1e9)
    svc.step()
    n = int(rate * seconds)
    cpu = mp.Value("d", float("nan"))
    proc = mp.Process(target=_submitter, args=(url, n, 1, rate, 0, cpu))
    redis0, leader0 = _redis_cpu_s(store), time.process_time()
    with _gc_pauses() as gc_ms:
        proc.start()
        run_until_enqueued(svc, store, n + 1, timeout_s=seconds * 5 + 60, proc=proc)
        proc.join()
    # Where the two cores went: this machine runs the leader, the submitter and redis-server.
    cpu_split = {
        "submitter_cpu_ms_per_submit": round(cpu.value / n * 1000, 3),
        "leader_cpu_ms_per_job": round((time.process_time() - leader0) / n * 1000, 3),
        "redis_cpu_ms_per_job": round((_redis_cpu_s(store) - redis0) / n * 1000, 3),
        "leader_gc_pause_ms_total": round(sum(gc_ms), 1),
        "leader_gc_pause_ms_max": round(max(gc_ms, default=0.0), 1),
    }
    ids = [j for j in store.job_ids() if j != f"b{10**9}"]
    rows = store.get_fields(ids, ["placement", "submitted_at"])
    enq = _enqueued_at(store, ids)
    lat = []
    for p, sub in rows:
        if p and sub:
            rq_id = json.loads(p)["rq_job_id"]
            if rq_id in enq:
                lat.append(enq[rq_id] - float(sub))
    a = np.array(lat) * 1000
    subs = sorted(float(sub) for _, sub in rows if sub)
    return {
        "rate_jobs_per_s": rate,
        "offered_rate_jobs_per_s": round((len(subs) - 1) / (subs[-1] - subs[0]), 1),
        "jobs": len(lat),
        # Submitted but never placed: the pool was full (their latency is not in the figures).
        "unplaced": n - len(lat),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "max_ms": round(float(a.max()), 2),
        "goal_p99_ms": 20,
        **cpu_split,
        "load_avg_1m": _load(),
    }


def _redis_cpu_s(store: RedisStore) -> float:
    info = store.r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@contextmanager
def _gc_pauses() -> Iterator[list[float]]:
    """The milliseconds of each garbage collection in this (the leader's) process meanwhile:
    a long one stalls every job that arrives during it."""
    import gc

    out: list[float] = []
    began = [0.0]

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            out.append((time.perf_counter() - began[0]) * 1000)

    gc.callbacks.append(cb)
    try:
        yield out
    finally:
        gc.callbacks.remove(cb)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def redis_reference(url: str) -> dict[str, Any]:
    """``redis-benchmark -q -P 16 -t set`` on the benchmark's own server (requests/s)."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"error": "redis-benchmark is not installed"}
    port = url.rsplit(":", 1)[1].split("/")[0]
    load = _load()
    cmd = [binary, "-q", "-P", "16", "-t", "set", "-p", port, "-n", "200000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    # "SET: 512820.52 requests per second, p50=1.2 msec" (the last \r-separated update)
    last = out.replace("\r", "\n").strip().splitlines()[-1]
    per_s = float(last.split(":", 1)[1].split("requests")[0])
    return {"command": " ".join(cmd[:-4] + cmd[-2:]), "set_per_s": per_s, "load_avg_1m": load}


def _rss_child(url: str, out: str) -> None:
    import redis

    store = RedisStore(redis.Redis.from_url(url))
    tiny = Pool.from_dict(
        {"name": "tiny", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 1}]}
    )
    svc = SchedulerService(store, tiny)
    for _ in range(5):
        svc.step()
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    Path(out).write_text(
        json.dumps({"peak_rss_mb": round(hwm / 1024, 1), "pending": store.count("pending")})
    )


def bench_rss(url: str, pending: int) -> dict[str, Any]:
    import redis

    store = RedisStore(redis.Redis.from_url(url))
    store.r.flushdb()
    _submitter(url, pending, 2000, None, 0)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        # Spawned, not forked: a forked child's high-water mark would count the pages it
        # inherits from this process after the throughput and latency runs.
        p = mp.get_context("spawn").Process(target=_rss_child, args=(url, f.name))
        p.start()
        p.join()
        got = json.loads(Path(f.name).read_text())
    return {**got, "submitted": pending, "goal_mb": 300}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=1000.0)
    # 9 s at 1,000 jobs/s: 9,000 jobs, all of which the 8,192-GPU pool holds (it fills at about
    # 9,770 of these jobs), so every submitted job's latency is in the figures.
    ap.add_argument("--seconds", type=float, default=9.0)
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--only",
        action="append",
        choices=["throughput", "latency", "rss"],
        help="run only this part (repeatable); the redis reference always runs",
    )
    args = ap.parse_args()
    parts = set(args.only or ["throughput", "latency", "rss"])
    if args.quick:
        args.jobs, args.seconds, args.pending = 4000, 5.0, 20_000
    pool = synthetic_pool(8192, seed=0)
    with private_redis() as url:
        results: dict[str, Any] = {"redis_reference": redis_reference(url)}
        if "throughput" in parts:
            results["throughput"] = bench_throughput(url, args.jobs, pool)
        if "latency" in parts:
            results["latency"] = bench_latency(url, args.rate, args.seconds, pool)
        if "rss" in parts:
            results["rss"] = bench_rss(url, args.pending)
        ref = results["redis_reference"].get("set_per_s")
        if ref and "throughput" in results:
            results["throughput"]["ratio_to_redis_set"] = round(
                results["throughput"]["jobs_per_s"] / ref, 5
            )
    doc = {
        "benchmark": "service",
        "command": " ".join([".venv/bin/python", "benchmarks/bench_service.py", *sys.argv[1:]]),
        "pool": pool.name,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "results": results,
    }
    # A partial run must not overwrite the full run's file that the README cites.
    name = "service.json" if args.only is None else f"service_{'_'.join(sorted(parts))}.json"
    write_result(name, doc)


if __name__ == "__main__":
    main()
