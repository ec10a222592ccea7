"""What one refresh of each dashboard page costs with a deep queue: ``--jobs`` 2-GPU jobs
submitted to the 32-GPU demo pool (``datasets/pools/mixed.toml``), one scheduler step (most
stay pending), then each endpoint timed ``--repeat`` times through Starlette's TestClient (no
network), against a private redis-server. The queue page lists its default 200 rows and
derives a pending reason for each pending one (``scheduler.dashboard.pending``).

Writes ``benchmarks/results/dashboard.json``. Run: ``.venv/bin/python
benchmarks/bench_dashboard.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import redis  # noqa: E402
from _common import private_redis  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from scheduler.core.pool import load_pool  # noqa: E402
from scheduler.dashboard.app import create_app  # noqa: E402
from scheduler.service.client import Client  # noqa: E402
from scheduler.service.leader import SchedulerService  # noqa: E402
from scheduler.service.store.redis_store import RedisStore  # noqa: E402

PATHS = ("/", "/api/pool", "/queue", "/api/queue", "/log", "/usage", "/api/usage")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/dashboard.json")
    args = ap.parse_args()
    pool = load_pool(REPO / "datasets/pools/mixed.toml")
    with private_redis() as url:
        store = RedisStore(redis.Redis.from_url(url))
        specs = [
            {"id": f"job-{i}", "model": "llama-3.1-70b", "task": "inference",
             "batch_size": 8, "input_len": 512, "output_len": 128, "num_requests": 100,
             "n_gpus": 2, "tensor_parallel": 2}
            for i in range(args.jobs)
        ]  # fmt: skip
        Client(store=store).submit_many(specs)
        SchedulerService(store, pool).step()
        states = {s: store.count(s) for s in ("pending", "placed", "rejected")}
        web = TestClient(create_app(store))
        timings = {}
        for path in (*PATHS, "/job/job-0", f"/job/job-{args.jobs - 1}"):
            got = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                resp = web.get(path)
                got.append(time.perf_counter() - t0)
                assert resp.status_code == 200, (path, resp.status_code)
            timings[path] = {
                "median_ms": round(1000 * statistics.median(got), 1),
                "max_ms": round(1000 * max(got), 1),
            }
        queue = web.get("/api/queue").json()
    out = {
        "jobs": args.jobs,
        "pool": pool.name,
        "states_after_one_step": states,
        "queue_rows_listed": len(queue["jobs"]),
        "pending_reasons_derived": sum(1 for j in queue["jobs"] if j["state"] == "pending"),
        "repeat": args.repeat,
        "timings": timings,
        "loadavg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
