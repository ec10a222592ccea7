"""Placement speed: 10,000 pending jobs onto a 1,024-GPU mixed pool in one tick (goal <= 1 s).

Writes benchmarks/results/placement.json with wall and CPU seconds (median of --repeats) per
policy, both for ``policy.schedule`` alone and for a full ``SchedulerCore.tick`` (which adds
the core's reject-if-it-fits-nowhere check). CPU seconds are reported because other work on a
shared 2-core machine inflates wall time.

    .venv/bin/python benchmarks/bench_placement.py [--jobs 10000] [--gpus 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from scheduler.core.clock import VirtualClock
from scheduler.core.loop import SchedulerCore
from scheduler.core.requests import PlacementRequest
from scheduler.core.synthetic import synthetic_pool
from scheduler.policies.registry import get_policy

OUT = Path(__file__).resolve().parent / "results" / "placement.json"
GOAL_S = 1.0
# Relative runtime per GPU type (A100-40, A100-80, H100, H200, B200), roughly by bf16 peak
# and bandwidth: the job's runtime on each type.
SPEED = np.array([1.0, 0.9, 0.45, 0.4, 0.22])


def jobs(n: int, seed: int) -> list[PlacementRequest]:
    """A seeded queue: VRAM log-normal around 12 GiB (a 7B-class job), mostly 1-GPU jobs."""
    rng = np.random.default_rng(seed)
    upper = np.minimum(rng.lognormal(2.5, 1.0, n), 175.0)
    n_gpus = rng.choice([1, 1, 1, 1, 1, 2, 4, 8], n)
    base = rng.lognormal(7.5, 1.2, n)
    types = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB")
    out = []
    for i in range(n):
        rt = base[i] * SPEED
        out.append(
            PlacementRequest(
                f"j{i:05d}",
                [upper[i] * 0.87] * 5,
                [upper[i]] * 5,
                rt,
                rt * 1.25,
                n_gpus=int(n_gpus[i]),
                requested_gpu=types[int(rng.integers(2, 5))],
                submit_time_s=float(i),
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policy",
        action="append",
        default=None,
        help="repeatable; default: rightsize requested firstfit bestfit easy_backfill",
    )
    args = ap.parse_args()
    policies = args.policy or ["rightsize", "requested", "firstfit", "bestfit", "easy_backfill"]
    pool = synthetic_pool(args.gpus, seed=args.seed)
    queue = jobs(args.jobs, args.seed)
    results: dict[str, dict[str, float | int | bool]] = {}
    for name in policies:
        walls, cpus, core_walls, core_cpus = [], [], [], []
        placed = 0
        for _ in range(args.repeats):
            state = pool.state()
            policy = get_policy(name)
            w, c = time.perf_counter(), time.process_time()
            decisions = policy.schedule(queue, state, 0.0, [])
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
            placed = sum(d.state == "placed" for d in decisions)
            state.assert_consistent()
            core = SchedulerCore(pool.state(), get_policy(name), VirtualClock())
            for r in queue:
                core.submit(r)
            w, c = time.perf_counter(), time.process_time()
            core.tick()
            core_walls.append(time.perf_counter() - w)
            core_cpus.append(time.process_time() - c)
        results[name] = {
            "schedule_wall_s": round(statistics.median(walls), 4),
            "schedule_cpu_s": round(statistics.median(cpus), 4),
            "tick_wall_s": round(statistics.median(core_walls), 4),
            "tick_cpu_s": round(statistics.median(core_cpus), 4),
            "placed": placed,
            "jobs_per_s": round(args.jobs / statistics.median(core_walls)),
            "meets_goal": statistics.median(core_cpus) <= GOAL_S,
        }
        print(name, results[name], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "benchmark": "placement",
                "jobs": args.jobs,
                "gpus": args.gpus,
                "classes": pool.n_classes,
                "seed": args.seed,
                "repeats": args.repeats,
                "goal_s": GOAL_S,
                "machine": f"{platform.machine()} {platform.processor()} python "
                f"{platform.python_version()}",
                "results": results,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
