"""The compute share of a job on a shared (MPS) GPU: one definition for price and execution.

A shared job is given the GPU's SMs in proportion to its memory reservation (at least its
even share of the GPU's client slots): the worker sets
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` to this share (rounded up to a percent), and option
pricing stretches the part of the job that saturates the GPU by ``1 / share``, as a MIG slice
stretches it by ``7 / compute_slices``. So a launch-bound job (small-batch decoding) is cheap on
a share and a compute-bound one costs what it would on the whole GPU.
"""

from __future__ import annotations

from typing import overload

import numpy as np

__all__ = ["MIN_SHARED_COMPUTE_SHARE", "shared_compute_share"]

#: The smallest share handed out: MPS takes whole percents, and 1% is its floor.
MIN_SHARED_COMPUTE_SHARE = 0.01


@overload
def shared_compute_share(reserved: float, capacity: float, max_jobs: float = ...) -> float: ...


@overload
def shared_compute_share(
    reserved: np.ndarray, capacity: np.ndarray, max_jobs: np.ndarray | float = ...
) -> np.ndarray: ...


def shared_compute_share(
    reserved: float | np.ndarray,
    capacity: float | np.ndarray,
    max_jobs: float | np.ndarray = 1.0,
) -> float | np.ndarray:
    """``reserved / capacity`` (same unit), at least ``1 / max_jobs``, within [1%, 100%].

    The floor: a GPU admits at most ``max_jobs`` clients (the node's ``max_shared_jobs``), so
    each can be promised that much of the SMs without over-subscribing them, however small its
    memory reservation.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.maximum(np.asarray(reserved, float) / capacity, 1.0 / np.asarray(max_jobs))
        share = np.clip(share, MIN_SHARED_COMPUTE_SHARE, 1.0)
    share = np.where(np.isfinite(share), share, 1.0)
    return float(share) if share.ndim == 0 else share
