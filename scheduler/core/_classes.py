"""Per-pool aggregates over option classes, computed once per pool and cached on it."""

from __future__ import annotations

import math

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import MIB_PER_GIB, MODE_SHARED, Pool

_N_TYPES = len(GPU_NAMES)


def gib(mib: int | float) -> float:
    return float(mib) / MIB_PER_GIB


def opt_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def class_cands(pool: Pool) -> list[np.ndarray]:
    cached = pool._empty.get("class_cands")
    if cached is None:
        cached = [np.flatnonzero(pool.cand_class == c) for c in range(pool.n_classes)]
        pool._empty["class_cands"] = cached
    return cached  # type: ignore[no-any-return]


def class_cand_nodes(pool: Pool) -> list[np.ndarray]:
    """Per class, the node of each of its MIG candidates (``class_cands``' order)."""
    cached = pool._empty.get("class_cand_nodes")
    if cached is None:
        cached = [pool.gpu_node[pool.cand_gpu[cands]] for cands in class_cands(pool)]
        pool._empty["class_cand_nodes"] = cached
    return cached  # type: ignore[no-any-return]


def node_max_size(pool: Pool) -> np.ndarray:
    cached = pool._empty.get("type_max_node")
    if cached is None:
        cached = np.zeros(_N_TYPES, np.int64)
        whole = pool.node_whole
        np.maximum.at(cached, pool.node_type[whole].astype(np.int64), pool.node_count[whole])
        pool._empty["type_max_node"] = cached
    return cached  # type: ignore[no-any-return]


def class_masks(pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """(n_types, K) and (3, K) boolean masks: which classes are of each type / each kind."""
    cached = pool._empty.get("class_masks")
    if cached is None:
        by_type = pool.class_type[None, :] == np.arange(_N_TYPES)[:, None]
        by_kind = pool.class_kind[None, :] == np.arange(3)[:, None]
        cached = (by_type, by_kind)
        pool._empty["class_masks"] = cached
    return cached  # type: ignore[no-any-return]


def shared_gpus(pool: Pool) -> np.ndarray:
    cached = pool._empty.get("shared_gpus")
    if cached is None:
        cached = np.flatnonzero(pool.gpu_mode == MODE_SHARED)
        pool._empty["shared_gpus"] = cached
    return cached  # type: ignore[no-any-return]
