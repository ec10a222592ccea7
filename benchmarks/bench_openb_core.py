"""openb replay through snugfit's SchedulerCore and live policies, against the legacy replay.

Simulated. Writes benchmarks/results/openb_core.json: per pod list and policy, the unallocated
GPU % at 130% arrived demand over seeds 42, 43, ... on both engines (the core path:
scheduler/sim/openb/core_replay.py; the legacy vectorised replay: scheduler/sim/openb/replay.py),
whether every seed's figure is equal, the distance to the paper's figure on `default`
(Weng et al., ATC'23: FGD 4.61%, BestFit 6.92%; the target is within 0.3 points), and the wall
and CPU seconds per seed of the core path (target: <= 10 s per seed on `default`).

    .venv/bin/python benchmarks/bench_openb_core.py [--seeds 10] [--policy fgd --policy bestfit]
        [--pods default ...]

Every pod list through the core in one command (written to openb_core_all.json after each list):

    .venv/bin/python benchmarks/bench_openb_core.py --seeds 10 --all-pods \
        --policy lookahead --policy fgd --policy bestfit --legacy-for gpuspec05 \
        --legacy-for gpuspec10 --out benchmarks/results/openb_core_all.json

With ``--all-pods`` the legacy replay runs only on the lists ``--legacy-for`` names; on the
others each seed's core figure is compared with the legacy figure stored in openb.json
(``legacy_stored``: the same seeds, from benchmarks/bench_openb.py) and, on ``default``, with
the core figures stored in openb_core.json and openb_core_lookahead.json (``core_stored``).
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
RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "openb_core.json"
# Stored per-seed figures the --all-pods sweep is checked against (same seeds 42..51).
LEGACY_STORED = RESULTS / "openb.json"
CORE_STORED = (RESULTS / "openb_core.json", RESULTS / "openb_core_lookahead.json")


def _stored(list_name: str, policy: str, seeds: list[int]) -> dict[str, Any]:
    """Each seed's figure as stored for this list and policy: the legacy replay's
    (openb.json) and, where stored, the core path's before this run (openb_core*.json)."""
    out: dict[str, Any] = {}
    if LEGACY_STORED.exists():
        doc = json.loads(LEGACY_STORED.read_text())
        r = doc["lists"].get(list_name, {}).get("results", {}).get(policy)
        if r is not None and doc.get("seeds") == seeds:
            out["legacy_stored"] = r["unallocated_gpu_pct_per_seed"]
    for f in CORE_STORED:
        if not f.exists():
            continue
        doc = json.loads(f.read_text())
        r = doc["lists"].get(list_name, {}).get(policy)
        if r is not None and doc.get("seeds") == seeds:
            out["core_stored"] = r["core"]["unallocated_gpu_pct_per_seed"]
            out["core_stored_from"] = f.name
    return out


def _run(nodes: str, pods: Path, policy: str, seeds: list[int], legacy_run: bool) -> dict[str, Any]:
    cluster, workload = load_nodes(nodes), load_pods(pods)
    core = replay_seeds(cluster, workload, policy, seeds, runner=replay_core)
    core.pop("allocation_ratio_by_demand")
    row: dict[str, Any] = {
        "core": core,
        "core_wall_s_per_seed": core["wall_s_per_seed"],
        "core_cpu_s_per_seed": core["cpu_s_per_seed"],
    }
    figures = core["unallocated_gpu_pct_per_seed"]
    if legacy_run:
        legacy = replay_seeds(cluster, workload, policy, seeds)
        legacy.pop("allocation_ratio_by_demand")
        row["legacy"] = legacy
        row["equal_per_seed"] = figures == legacy["unallocated_gpu_pct_per_seed"]
    else:
        for key, ref in _stored(openb_list_name(pods), policy, seeds).items():
            row[key] = ref
            if key != "core_stored_from":
                row[f"equal_per_seed_{key}"] = figures == ref
    paper = PAPER_UNALLOCATED_PCT.get(policy) if pods.name == DEFAULT_PODS_CSV.name else None
    if paper is not None:
        gap = core["unallocated_gpu_pct_at_130"] - paper
        row["paper_unallocated_pct"] = paper
        row["core_minus_paper_pct"] = round(gap, 3)
        row["within_tolerance"] = abs(gap) <= PAPER_TOLERANCE_PCT
    return row


def _agrees(row: dict[str, Any]) -> str:
    """Whether the core's figure equals the legacy replay's on every seed, and how that was
    checked (run here, or the stored openb.json figures)."""
    if "equal_per_seed" in row:
        return "yes (run)" if row["equal_per_seed"] else "**no** (run)"
    if "equal_per_seed_legacy_stored" in row:
        return "yes (stored)" if row["equal_per_seed_legacy_stored"] else "**no** (stored)"
    return "—"


def markdown_table(out: dict[str, Any]) -> str:
    """The README table of an --all-pods run: per list, lookahead (ours; what rightsize runs on
    openb pools), FGD and BestFit through the core (mean ± std), ours − FGD, and whether each
    policy's per-seed figures equal the legacy replay's."""
    cols = ["lookahead", "fgd", "bestfit"]
    lines = [
        "| pod list | lookahead (ours) | FGD | BestFit | ours − FGD | core = legacy per seed "
        "(lookahead / FGD / BestFit) | core s/seed (wall, CPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(out["lists"], key=lambda n: (n != "default", n)):
        entry = out["lists"][name]
        cells, agree, speed = [], [], []
        for p in cols:
            r = entry.get(p)
            if r is None:
                cells.append("—")
                continue
            c = r["core"]
            txt = f"{c['unallocated_gpu_pct_at_130']:.2f}% ± {c['unallocated_gpu_pct_std']:.2f}"
            cells.append(f"**{txt}**" if p == "lookahead" else txt)
            agree.append(_agrees(r))
            speed.append(f"{c['wall_s_per_seed']:.1f}, {c['cpu_s_per_seed']:.1f}")
        gap = out.get("lookahead_minus_fgd_pct", {}).get(name)
        label = f"`{name}`" + (" (paper: FGD 4.61%, BestFit 6.92%)" if name == "default" else "")
        gap_txt = "—" if gap is None else f"{gap:+.2f}"
        lines.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {gap_txt} | {' / '.join(agree)} | {' / '.join(speed)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = openb_arguments(argparse.ArgumentParser())
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true", help="print --out as the README table only")
    ap.add_argument("--all-pods", action="store_true", help="every openb_pod_list_*.csv")
    ap.add_argument(
        "--legacy-for",
        action="append",
        default=None,
        help="with --all-pods: lists the legacy replay runs on too (others: stored figures)",
    )
    args = ap.parse_args()
    if args.table:
        print(markdown_table(json.loads(args.out.read_text())))
        return
    policies = args.policy or ["fgd", "bestfit", "fgdstrand"]
    seeds = list(range(42, 42 + args.seeds))
    if args.all_pods:
        found = sorted(DEFAULT_PODS_CSV.parent.glob("openb_pod_list_*.csv"))
        lists = sorted(found, key=lambda p: p.name != DEFAULT_PODS_CSV.name)
    else:
        lists = openb_pod_lists(args.pods)
    legacy_for = set(args.legacy_for or [])
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "openb_core_130pct",
        "simulated": True,
        "command": "python benchmarks/bench_openb_core.py "
        + f"--seeds {args.seeds} "
        + (
            "--all-pods" + "".join(f" --legacy-for {n}" for n in sorted(legacy_for))
            if args.all_pods
            else " ".join(f"--pods {openb_list_name(p)}" for p in lists)
        )
        + "".join(f" --policy {p}" for p in policies)
        + ("" if args.out == OUT else f" --out {_rel(args.out)}"),
        "nodes": Path(args.nodes).name,
        "seeds": seeds,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "speed_target_s": SPEED_TARGET_S,
        "paper_tolerance_pct": PAPER_TOLERANCE_PCT,
        "lists": {},
    }
    for pods in lists:
        name = openb_list_name(pods)
        legacy_run = not args.all_pods or name in legacy_for
        entry: dict[str, Any] = {}
        out["lists"][name] = entry
        for p in policies:
            r = entry[p] = _run(args.nodes, pods, p, seeds, legacy_run)
            same = {k: v for k, v in r.items() if k.startswith("equal_per_seed")}
            print(
                f"{name:>12} {p:>10}: core {r['core']['unallocated_gpu_pct_at_130']:.3f}%"
                + (
                    f" legacy {r['legacy']['unallocated_gpu_pct_at_130']:.3f}%"
                    if "legacy" in r
                    else ""
                )
                + f" {same} core {r['core_wall_s_per_seed']:.1f} s/seed wall,"
                f" {r['core_cpu_s_per_seed']:.1f} s CPU",
                flush=True,
            )
        if "fgd" in entry and "lookahead" in entry:
            gap = (
                entry["lookahead"]["core"]["unallocated_gpu_pct_at_130"]
                - entry["fgd"]["core"]["unallocated_gpu_pct_at_130"]
            )
            out.setdefault("lookahead_minus_fgd_pct", {})[name] = round(gap, 3)
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
    gaps = out.get("lookahead_minus_fgd_pct")
    if gaps:
        out["lookahead_no_worse_than_fgd_everywhere"] = all(g <= 0 for g in gaps.values())
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(out, indent=1) + "\n")


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


if __name__ == "__main__":
    main()
