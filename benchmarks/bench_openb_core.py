"""openb replay through snugfit's SchedulerCore and live policies, against the legacy replay.

Simulated. Writes benchmarks/results/openb_core.json: per pod list and policy, the unallocated
GPU % at 130% arrived demand over seeds 42, 43, ... on both engines (the core path:
scheduler/sim/openb/core_replay.py; the legacy vectorised replay: scheduler/sim/openb/replay.py),
whether every seed's figure is equal, the distance to the paper's figure on `default`
(Weng et al., ATC'23: FGD 4.61%, BestFit 6.92%; the target is within 0.3 points), and the wall
and CPU seconds per seed of the core path (target: <= 10 s per seed on `default`).

    .venv/bin/python benchmarks/bench_openb_core.py [--seeds 10] [--policy fgd --policy bestfit]
        [--pods default ...]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from _common import openb_arguments, openb_list_name, openb_pod_lists

from scheduler.sim.openb.core_replay import replay_core
from scheduler.sim.openb.replay import replay_seeds
from scheduler.sim.openb.trace import DEFAULT_PODS_CSV, load_nodes, load_pods

PAPER_UNALLOCATED_PCT = {"fgd": 4.61, "bestfit": 6.92, "gpupacking": 8.00, "dotproduct": 9.15}
PAPER_TOLERANCE_PCT = 0.3
SPEED_TARGET_S = 10.0
OUT = Path(__file__).resolve().parent / "results" / "openb_core.json"


def _run(nodes: str, pods: Path, policy: str, seeds: list[int]) -> dict[str, Any]:
    cluster, workload = load_nodes(nodes), load_pods(pods)
    core = replay_seeds(cluster, workload, policy, seeds, runner=replay_core)
    legacy = replay_seeds(cluster, workload, policy, seeds)
    for r in (core, legacy):
        r.pop("allocation_ratio_by_demand")
    row: dict[str, Any] = {
        "core": core,
        "legacy": legacy,
        "equal_per_seed": core["unallocated_gpu_pct_per_seed"]
        == legacy["unallocated_gpu_pct_per_seed"],
        "core_wall_s_per_seed": core["wall_s_per_seed"],
        "core_cpu_s_per_seed": core["cpu_s_per_seed"],
    }
    paper = PAPER_UNALLOCATED_PCT.get(policy) if pods.name == DEFAULT_PODS_CSV.name else None
    if paper is not None:
        gap = core["unallocated_gpu_pct_at_130"] - paper
        row["paper_unallocated_pct"] = paper
        row["core_minus_paper_pct"] = round(gap, 3)
        row["within_tolerance"] = abs(gap) <= PAPER_TOLERANCE_PCT
    return row


def main() -> None:
    ap = openb_arguments(argparse.ArgumentParser())
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    policies = args.policy or ["fgd", "bestfit", "fgdstrand"]
    seeds = list(range(42, 42 + args.seeds))
    lists = openb_pod_lists(args.pods)
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "openb_core_130pct",
        "simulated": True,
        "command": "python benchmarks/bench_openb_core.py "
        + f"--seeds {args.seeds} "
        + " ".join(f"--pods {openb_list_name(p)}" for p in lists)
        + "".join(f" --policy {p}" for p in policies),
        "nodes": Path(args.nodes).name,
        "seeds": seeds,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "speed_target_s": SPEED_TARGET_S,
        "paper_tolerance_pct": PAPER_TOLERANCE_PCT,
        "lists": {},
    }
    for pods in lists:
        entry = {p: _run(args.nodes, pods, p, seeds) for p in policies}
        name = openb_list_name(pods)
        out["lists"][name] = entry
        for p, r in entry.items():
            print(
                f"{name:>12} {p:>10}: core {r['core']['unallocated_gpu_pct_at_130']:.3f}%"
                f" legacy {r['legacy']['unallocated_gpu_pct_at_130']:.3f}%"
                f" equal={r['equal_per_seed']} core {r['core_wall_s_per_seed']:.1f} s/seed wall,"
                f" {r['core_cpu_s_per_seed']:.1f} s CPU",
                flush=True,
            )
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    default = out["lists"].get("default", {})
    if default:
        out["default_core_wall_s_per_seed_max"] = max(
            r["core"]["wall_s_max"] for r in default.values()
        )
        out["default_core_cpu_s_per_seed_max"] = max(
            r["core_cpu_s_per_seed"] for r in default.values()
        )
        out["default_meets_speed_target_cpu"] = (
            out["default_core_cpu_s_per_seed_max"] <= SPEED_TARGET_S
        )
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
