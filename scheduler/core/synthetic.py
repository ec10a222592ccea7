"""A big synthetic mixed pool for benchmarks and tests (same seed, same pool)."""

from __future__ import annotations

from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import Pool
from scheduler.exceptions import PoolError

__all__ = ["synthetic_pool"]


def synthetic_pool(
    n_gpus: int,
    seed: int = 0,
    *,
    gpus_per_node: int = 8,
    mig_fraction: float = 0.0625,
    shared_fraction: float = 0.0625,
) -> Pool:
    """A big mixed pool for benchmarks: ``n_gpus`` GPUs in nodes of ``gpus_per_node``.

    Types are drawn with fleet-like weights (many A100s and H100s, fewer H200/B200); about
    ``mig_fraction`` of nodes are dynamic-MIG A100-80GB/H100 nodes and ``shared_fraction`` are
    shared (MPS) nodes. Same seed, same pool.
    """
    if n_gpus < gpus_per_node or n_gpus % gpus_per_node:
        raise PoolError(
            f"synthetic_pool needs n_gpus as a positive multiple of {gpus_per_node}; got {n_gpus}"
        )
    rng = np.random.default_rng(seed)
    n_nodes = n_gpus // gpus_per_node
    weights = np.array([0.20, 0.25, 0.30, 0.15, 0.10])
    types = rng.choice(len(GPU_NAMES), size=n_nodes, p=weights)
    modes = rng.choice(
        3, size=n_nodes, p=[1 - mig_fraction - shared_fraction, mig_fraction, shared_fraction]
    )
    nodes: list[dict[str, Any]] = []
    for k in range(n_nodes):
        t = GPU_NAMES[int(types[k])]
        mode = ("whole", "mig", "shared")[int(modes[k])]
        node: dict[str, Any] = {"name": f"n{k:05d}", "gpu": t, "count": gpus_per_node}
        node["mode"] = mode
        if mode == "mig":
            node["mig"] = "dynamic"
        nodes.append(node)
    return Pool.from_dict({"name": f"synthetic-{n_gpus}-s{seed}", "nodes": nodes})
