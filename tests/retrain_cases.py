"""The retraining gate's cases, shared by ``tests/scheduler/service/test_retrain.py`` and
``benchmarks/bench_retrain.py`` (which reports the same cases with their figures): published
peak-VRAM runs measured again by workers on two nodes (``n0``, ``n1``, alternating), honestly
or by nodes with a broken memory reading."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BROKEN", "HONEST", "Factor", "N", "published_vram", "remeasured"]

REPO = Path(__file__).resolve().parent.parent
#: History rows per case: the retrain threshold the tests and the benchmark use.
N = 24

Factor = Callable[[int, str], float]  # (row number, node) -> multiplier of the published peak


def _noise(i: int, node: str) -> float:
    return 1.0 + float(np.random.default_rng(1000 + i).uniform(-0.05, 0.05))


def _random(i: int, node: str) -> float:
    return float(np.random.default_rng(2000 + i).choice([5.0, 0.2]))


#: Rows the gate must accept: the published peaks, and the same with ±5% measurement noise.
HONEST: dict[str, Factor] = {"agreeing": lambda i, n: 1.0, "noise_5pct": _noise}
#: Rows it must reject: far outside the incumbent's calibrated residuals.
BROKEN: dict[str, Factor] = {
    "doubled": lambda i, n: 2.0,
    "tripled": lambda i, n: 3.0,
    "times_0.4": lambda i, n: 0.4,
    "contradictory_2x_0.5x": lambda i, n: 2.0 if n == "n0" else 0.5,
    "random_5x_0.2x": _random,
}


def published_vram() -> list[dict[str, Any]]:
    """The rows of ``datasets/measured/published.jsonl`` with a peak-VRAM figure."""
    path = REPO / "datasets" / "measured" / "published.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if r.get("peak_vram_gib") is not None]


def remeasured(run: dict[str, Any], i: int, factor: Factor, row_id: str) -> str:
    """History row ``i`` (JSON): published ``run`` measured again on node ``n{i % 2}``, its
    peak times ``factor(i, node)``, as that node's worker appends it."""
    node = f"n{i % 2}"
    row = dict(run, id=row_id, origin="history", simulated=False)
    row["source"] = f"snugfit worker w-{node} node {node}, job re-{i}@1"
    row["hardware"] = {"node": node}
    row["peak_vram_gib"] = round(run["peak_vram_gib"] * factor(i, node), 3)
    return json.dumps(row)
