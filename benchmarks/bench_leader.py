"""The leader alone: ``--jobs`` jobs are submitted first, then timed ``SchedulerService.step``
calls place them all (ingest, decide, commit, enqueue, log) on an 8,192-GPU synthetic pool,
against a private redis-server. Records wall and the leader process's CPU seconds, so a
figure from a shared machine can be read per CPU-second; the load average is recorded too.

``--window N`` ingests at most N jobs a step (default 5000: one step places them all); a small
window (``--window 20``) is the per-step regime of the latency benchmark (a job or a few per
step), where fixed per-step costs count. ``decision_bytes_mean`` is the mean size of the
``decision`` field the placed jobs' records keep. Writes ``benchmarks/results/leader.json`` (with
``--window``: ``leader_w<N>.json``). Run: ``.venv/bin/python benchmarks/bench_leader.py``.
A checkout of another commit on ``PYTHONPATH`` compares like with like (same script).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import redis  # noqa: E402
from _common import private_redis, write_result  # noqa: E402
from bench_service import _submitter  # noqa: E402

from scheduler.core.synthetic import synthetic_pool  # noqa: E402
from scheduler.service.leader import SchedulerService  # noqa: E402
from scheduler.service.store.redis_store import RedisStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--window", type=int, default=5000)
    args = ap.parse_args()
    pool = synthetic_pool(8192, seed=0)
    with private_redis() as url:
        store = RedisStore(redis.Redis.from_url(url))
        _submitter(url, args.jobs, 1000, None, 0)
        svc = SchedulerService(store, pool, window=args.window, placement_lease_s=1e9)
        load0 = os.getloadavg()[0]
        c0, t0 = time.process_time(), time.perf_counter()
        while store.count("placed") < args.jobs:
            s = svc.step()
            if s.ingested == 0 and s.placed == 0:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        placed = store.count("placed")
        # What each placed job's record keeps of its decision (Decision.to_dict(compact=True)).
        stored = [len(row[0]) for row in store.get_fields(store.job_ids(), ["decision"]) if row[0]]
    doc = {
        "benchmark": "leader",
        "command": " ".join([".venv/bin/python", "benchmarks/bench_leader.py", *sys.argv[1:]]),
        "pool": pool.name,
        "jobs": args.jobs,
        "window": args.window,
        "placed": placed,
        "wall_s": round(wall, 3),
        "jobs_per_s": round(placed / wall, 1),
        "leader_cpu_s": round(cpu, 3),
        "jobs_per_cpu_s": round(placed / cpu, 1),
        "decision_bytes_mean": round(sum(stored) / max(len(stored), 1), 1),
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    write_result("leader.json" if args.window == 5000 else f"leader_w{args.window}.json", doc)


if __name__ == "__main__":
    main()
