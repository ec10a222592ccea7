"""How deep `lookahead` looks: unallocated GPU % at 130% demand against the look-ahead depth.

Simulated. The depth (arrivals of the mix each GPU gap is looked ahead over,
scheduler/policies/_lookahead_maths.py) is a design parameter; this sweep is how it was chosen,
on `default` and a few seeds (the other pod lists stay held out for benchmarks/bench_openb.py).
Writes benchmarks/results/openb_lookahead_depth.json.

    .venv/bin/python benchmarks/bench_openb_lookahead_depth.py [--seeds 3] [--pods default]
        [--depth 16 --depth 64 ...] [--learn-every 200 --out ...]

``--learn-every N`` learns the mix online instead, from the pods arrived so far (re-learned every
N arrivals), rather than from the pod list as FGD's target workload is.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

from scheduler.policies._lookahead_maths import DEFAULT_LOOKAHEAD_ARRIVALS
from scheduler.sim.openb.replay import replay, replay_seeds
from scheduler.sim.openb.trace import DEFAULT_NODES_CSV, DEFAULT_PODS_CSV, load_nodes, load_pods

OUT = Path(__file__).resolve().parent / "results" / "openb_lookahead_depth.json"
DEPTHS = [1, 4, 16, 32, 64, 128, 256, 1024]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pods", default="default", help="list name or csv path")
    ap.add_argument("--depth", type=int, action="append", default=None)
    ap.add_argument("--learn-every", type=int, default=0, help="learn the mix online")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    depths = args.depth or DEPTHS
    seeds = list(range(42, 42 + args.seeds))
    pods_path = (
        DEFAULT_PODS_CSV.parent / f"openb_pod_list_{args.pods}.csv"
        if "/" not in args.pods
        else Path(args.pods)
    )
    cluster, pods = load_nodes(DEFAULT_NODES_CSV), load_pods(pods_path)
    out: dict[str, Any] = {
        "benchmark": "openb_lookahead_depth",
        "simulated": True,
        "command": f"python benchmarks/bench_openb_lookahead_depth.py --seeds {args.seeds} "
        f"--pods {args.pods}"
        + "".join(f" --depth {d}" for d in depths)
        + (f" --learn-every {args.learn_every}" if args.learn_every else ""),
        "pods": pods_path.stem,
        "seeds": seeds,
        "default_depth": DEFAULT_LOOKAHEAD_ARRIVALS,
        "mix": (
            f"pods arrived so far, re-learned every {args.learn_every}"
            if args.learn_every
            else "the pod list's"
        ),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "depths": {},
    }
    t0 = time.perf_counter()
    for d in depths:
        run = functools.partial(replay, arrivals=d, learn_every=args.learn_every)
        r = replay_seeds(cluster, pods, "lookahead", seeds, runner=run)
        out["depths"][str(d)] = {
            "unallocated_gpu_pct_at_130": r["unallocated_gpu_pct_at_130"],
            "unallocated_gpu_pct_per_seed": r["unallocated_gpu_pct_per_seed"],
            "cpu_s_per_seed": r["cpu_s_per_seed"],
        }
        print(f"depth {d:>5}: {r['unallocated_gpu_pct_at_130']:.3f}%", flush=True)
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
