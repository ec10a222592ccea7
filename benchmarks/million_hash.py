"""A SHA-256 over every decision of a ``bench_million`` run, to show that a speed-up decides
exactly as before.

Each decision feeds its tick time, job id, state, chosen and runner-up indices and, for a
placed one, the committed option (kind, type, node, GPU indices, MIG profile and start, GPUs,
nodes, capacity, reservation, CPUs, host memory, runtime, cost) into the hash, floats by
``repr`` (exact). The run's metrics (wall-clock figures left out) are printed beside it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/million_hash.py --jobs 20000 --gpus 1024 \\
        --policy bestfit

Takes the same arguments as ``bench_million.py`` (``--out`` and ``--profile`` are ignored).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from bench_million import arguments, build, run

from scheduler.core.decision import Decision
from scheduler.core.loop import SchedulerCore

# Metrics that are timings, not outcomes.
_TIMINGS = ("wall_s", "placements_per_s")


class DecisionHash:
    """An observer that hashes every decision of every tick."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.n = 0

    def __call__(self, core: SchedulerCore, decisions: list[Decision], now: float) -> None:
        parts: list[str] = []
        for d in decisions:
            self.n += 1
            row: list[Any] = [repr(now), d.job_id, d.state, d.chosen, d.runner_up]
            o = d.chosen_option if d.state == "placed" else None
            if o is not None:
                row += [
                    o.kind,
                    o.gpu_type,
                    o.node,
                    o.gpu_indices,
                    o.mig_profile,
                    o.mig_start,
                    o.n_gpus,
                    o.n_nodes,
                    repr(o.capacity_gib),
                    repr(o.reserved_gib),
                    repr(o.cpus),
                    repr(o.host_memory_gib),
                    repr(o.runtime_s),
                    repr(o.cost_usd),
                ]
            parts.append("|".join(map(str, row)))
        self.h.update(("\n".join(parts) + "\n").encode())


def main() -> None:
    args = arguments()
    obs = DecisionHash()
    sim, _wl, stages = build(args, observer=obs)
    t = time.perf_counter()
    result = run(sim)
    stages["simulate_s"] = time.perf_counter() - t
    metrics = {k: v for k, v in result.to_dict().items() if k not in _TIMINGS}
    print(
        json.dumps(
            {
                "decisions": obs.n,
                "sha256": obs.h.hexdigest(),
                "metrics_sha256": hashlib.sha256(
                    json.dumps(metrics, sort_keys=True).encode()
                ).hexdigest(),
                "ticks": sim.core.counters.ticks,
                "stages_s": {k: round(v, 2) for k, v in stages.items()},
                "metrics": metrics,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
