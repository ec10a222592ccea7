"""Scale: 1,000,000 jobs of the realistic workload on a 10,000-GPU synthetic pool.

Goal (issue #5): the whole simulation in <= 10 min on the 2-core dev machine. The arrival rate
scales with the pool (the mixed pool's 400 jobs/day per 32 GPUs), so load per GPU stays the
same as in the week benchmark. Each stage is timed separately: workload generation, prediction,
the simulation itself. The core ticks at most once per ``--tick-interval`` seconds of virtual
time (Slurm's ``sched_interval``; 0 = at every event). Writes benchmarks/results/million.json
(or ``--out``); smaller runs go through ``--jobs``/``--gpus``.

    .venv/bin/python benchmarks/bench_million.py [--jobs 1000000] [--gpus 10000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import time
from pathlib import Path
from typing import Any

from scheduler.core.synthetic import synthetic_pool
from scheduler.policies.registry import get_policy
from scheduler.sim.simulator import Observer, SimulationResult, Simulator
from scheduler.sim.workload import Workload, generate_workload, load_mix, predict_workload

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "million.json"
GOAL_S = 600.0
# The week benchmark's load: 400 jobs/day on the 32-GPU mixed pool.
JOBS_PER_DAY_PER_GPU = 400.0 / 32.0


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--policy", default="rightsize")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tick-interval", type=float, default=60.0)
    ap.add_argument("--no-feedback", action="store_true")
    ap.add_argument(
        "--no-smallest-fit", action="store_true", help="Skip the smallest-fit rate (null)."
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the simulation stage.")
    ap.add_argument(
        "--setup-only",
        action="store_true",
        help="Time workload, predict and simulator setup, then stop (prints the stages).",
    )
    ap.add_argument("--out", default=str(OUT))
    return ap.parse_args(argv)


def build(
    args: argparse.Namespace, observer: Observer | None = None
) -> tuple[Simulator, Workload, dict[str, float]]:
    """The pool, the workload, its predictions and the simulator, each stage timed.

    Python's cyclic collector is paused while they are built and what they built is then
    frozen out of it (``gc.freeze``): millions of long-lived objects, no garbage cycles to
    find among them, and every full collection would walk them all again (during the setup,
    and again in each full collection of the run).
    """
    gc.disable()
    try:
        return _build(args, observer)
    finally:
        gc.freeze()
        gc.enable()


def _build(
    args: argparse.Namespace, observer: Observer | None
) -> tuple[Simulator, Workload, dict[str, float]]:
    stages: dict[str, float] = {}
    t = time.perf_counter()
    gpus = args.gpus - args.gpus % 8
    pool = synthetic_pool(gpus, args.seed)
    rate = JOBS_PER_DAY_PER_GPU * gpus
    mix = load_mix()
    # A little more horizon than needed, then cut at --jobs (arrivals are random).
    days = 1.1 * args.jobs / (rate * 1.0) + 0.05
    wl = generate_workload(days, args.seed, mix=mix, jobs_per_day=rate, max_jobs=args.jobs)
    stages["workload_s"] = time.perf_counter() - t
    print(f"workload: {len(wl):,} jobs in {stages['workload_s']:.1f} s", flush=True)

    t = time.perf_counter()
    table = predict_workload(wl)
    stages["predict_s"] = time.perf_counter() - t
    print(f"predict: {stages['predict_s']:.1f} s", flush=True)

    t = time.perf_counter()
    sim = Simulator(
        pool,
        get_policy(args.policy),
        wl,
        table,
        seed=args.seed,
        # The smallest-fit rate is reported beside the runtime (issue #16); it is one
        # vectorised enumeration per 20k finished jobs at the end (in simulate_s).
        smallest_fit=not args.no_smallest_fit,
        feedback=not args.no_feedback,
        tick_interval_s=args.tick_interval,
        observer=observer,
    )
    stages["simulator_setup_s"] = time.perf_counter() - t
    print(f"setup: {stages['simulator_setup_s']:.1f} s", flush=True)
    return sim, wl, stages


def run(sim: Simulator) -> SimulationResult:
    """``sim.run()`` with the cyclic collector paused: the run makes next to no cyclic garbage
    (a 100k-job run leaves 317 unreachable objects behind), so each collection would only walk
    the live jobs again (about a tenth of the 1M run's time went to it)."""
    gc.disable()
    try:
        return sim.run()
    finally:
        gc.enable()


def main() -> None:
    args = arguments()
    sim, wl, stages = build(args)
    pool = sim.pool
    if args.setup_only:
        print(json.dumps({k: round(v, 2) for k, v in stages.items()}))
        return

    t = time.perf_counter()
    prof = cProfile.Profile() if args.profile else None
    if prof is not None:
        prof.enable()
    result = run(sim)
    if prof is not None:
        prof.disable()
    stages["simulate_s"] = time.perf_counter() - t
    total = sum(stages.values())
    metrics = result.to_dict()
    print(f"simulate: {stages['simulate_s']:.1f} s; total {total:.1f} s", flush=True)
    out: dict[str, Any] = {
        "benchmark": "million_jobs",
        "command": (
            f"python benchmarks/bench_million.py --jobs {args.jobs} --gpus {args.gpus} "
            f"--policy {args.policy} --tick-interval {args.tick_interval:g}"
        ),
        "n_jobs": len(wl),
        "n_gpus": pool.n_gpus,
        "policy": args.policy,
        "tick_interval_s": args.tick_interval,
        "ticks": sim.core.counters.ticks,
        "stages_s": {k: round(v, 2) for k, v in stages.items()},
        "total_s": round(total, 2),
        "goal_s": GOAL_S,
        "meets_goal": total <= GOAL_S,
        "jobs_per_s_simulated": round(len(wl) / stages["simulate_s"], 1),
        "metrics": metrics,
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out["profile_top"] = buf.getvalue().splitlines()[:60]
        print(buf.getvalue()[:6000])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
