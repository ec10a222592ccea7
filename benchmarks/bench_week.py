"""A simulated week of the realistic workload on the mixed pool, every policy side by side.

Writes benchmarks/results/week.json. Goals (issue #5), for ``rightsize`` against ``requested``:
cost >= 30% lower, OOM kills <= 1% of jobs, median reserved/actual VRAM <= 1.15, p95 queueing
delay no worse. First runs are predicted by ``--predictor``: the analytical tier (default) or
the shipped learned tier with its conformal bounds (``tiered``, what the service uses). Every
policy runs with history feedback for re-runs (as the live service does);
``rightsize`` also runs without it, so the effect of feedback on OOMs and reserved/actual shows.

    .venv/bin/python benchmarks/bench_week.py [--days 7] [--seed 0] [--policy rightsize ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from predictor.analytical import predict_table
from scheduler.core.pool import load_pool
from scheduler.sim.simulator import simulate
from scheduler.sim.workload import generate_workload

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "week.json"
POLICIES = ("rightsize", "requested", "firstfit", "bestfit", "fgd", "easy_backfill")
GOAL_COST_SAVING = 0.30
GOAL_OOM_RATE = 0.01
GOAL_RESERVED_OVER_ACTUAL = 1.15


def _goals(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    saving = 1.0 - ours["cost_usd"] / base["cost_usd"]
    return {
        "cost_saving_vs_requested": round(saving, 4),
        "cost_goal_met": saving >= GOAL_COST_SAVING,
        "oom_kill_rate": ours["oom_kill_rate"],
        "oom_goal_met": ours["oom_kill_rate"] <= GOAL_OOM_RATE,
        "reserved_over_actual_median": ours["reserved_over_actual_median"],
        "reserved_goal_met": ours["reserved_over_actual_median"] <= GOAL_RESERVED_OVER_ACTUAL,
        "queue_delay_p95_s": ours["queue_delay_p95_s"],
        "requested_queue_delay_p95_s": base["queue_delay_p95_s"],
        "queue_goal_met": ours["queue_delay_p95_s"] <= base["queue_delay_p95_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pool", default=str(REPO / "datasets" / "pools" / "mixed.toml"))
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument(
        "--predictor",
        choices=("analytical", "tiered"),
        default="analytical",
        help="tiered: the service's shipped learned tier with conformal bounds",
    )
    ap.add_argument("--out", default=None, help="default results/week[_tiered].json")
    args = ap.parse_args()
    if args.out is None:
        args.out = str(OUT if args.predictor == "analytical" else OUT.with_name("week_tiered.json"))
    policies = args.policy or list(POLICIES)
    pool = load_pool(args.pool)
    wl = generate_workload(args.days, args.seed)
    if args.predictor == "tiered":
        from predictor.tiered import TieredPredictor

        table = TieredPredictor.default().predict_table(list(wl.specs))
    else:
        table = predict_table(list(wl.specs))
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for name in policies:
        for feedback in (True, False) if name == "rightsize" else (True,):
            r = simulate(pool, [name], wl, seed=args.seed, predictions=table, feedback=feedback)
            row = r[0].to_dict()
            runs.append(row)
            print(
                f"{name:>14} feedback={feedback!s:5}: ${row['cost_usd']:,.0f}, "
                f"OOM {row['oom_kills']} ({row['oom_kill_rate']:.1%}), "
                f"res/act p50 {row['reserved_over_actual_median']:.2f}, "
                f"wait p95 {row['queue_delay_p95_s']:,.0f} s, {row['wall_s']:.0f} s wall",
                flush=True,
            )
    by = {(r["policy"], r["feedback"]): r for r in runs}
    goals: dict[str, Any] = {}
    base = by.get(("requested", True))
    for fb in (True, False):
        ours = by.get(("rightsize", fb))
        if ours is not None and base is not None:
            goals["with_feedback" if fb else "without_feedback"] = _goals(ours, base)
    out = {
        "benchmark": "week_mixed_pool",
        "command": (
            f"python benchmarks/bench_week.py --days {args.days:g} --seed {args.seed} "
            f"--predictor {args.predictor}"
        ),
        "predictor": args.predictor,
        "pool": Path(args.pool).name,
        "days": args.days,
        "seed": args.seed,
        "n_jobs": len(wl),
        "recurring_share": round(float(wl.recurring.mean()), 4),
        "goals": goals,
        "runs": runs,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(goals, indent=1))


if __name__ == "__main__":
    main()
