"""The checks :meth:`PoolState.allocate` makes before it changes anything: the option's GPUs
exist, are one type on nodes of the option's mode, and the slot they name (whole GPUs, a MIG
instance or a share of one GPU) is free and holds the reservation. Each failure is a
:class:`PlacementError` that names the job, the GPUs and what blocks them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import MODE_CODES, MODE_MIG, MODE_WHOLE, Pool
from scheduler.exceptions import PlacementError

if TYPE_CHECKING:
    from scheduler.core.decision import Option
    from scheduler.core.state import PoolState

__all__ = ["checked_gpus", "slot_use"]


def checked_gpus(
    pool: Pool, option: Option, job_id: str
) -> tuple[tuple[int, ...], np.ndarray, int]:
    """(GPU indices, the same as an array, mode code) of ``option``, checked against ``pool``."""
    gpus = tuple(int(g) for g in option.gpu_indices)
    if not gpus:
        raise PlacementError(
            f"job {job_id!r}: option {option.label} names no GPUs (it does not fit now)"
        )
    if len(gpus) == 1:
        return _checked_one(pool, option, job_id, gpus)
    idx = np.array(gpus, np.int64)
    if idx.min() < 0 or idx.max() >= pool.n_gpus or len(set(gpus)) != len(gpus):
        raise PlacementError(f"job {job_id!r}: GPU indices {gpus} are invalid for this pool")
    type_name = GPU_NAMES[int(pool.gpu_type[gpus[0]])]
    if (pool.gpu_type[idx] != pool.gpu_type[gpus[0]]).any() or type_name != option.gpu_type:
        raise PlacementError(
            f"job {job_id!r}: GPUs {gpus} are not all {option.gpu_type}; pool has "
            f"{[GPU_NAMES[int(t)] for t in pool.gpu_type[idx]]}"
        )
    mode = MODE_CODES[option.kind]
    # Shared nodes with whole_gpus take whole-GPU options too.
    on_mode = pool.gpu_mode[idx] == mode
    if mode == MODE_WHOLE:
        on_mode |= pool.node_whole[pool.gpu_node[idx]]
    if not on_mode.all():
        node = pool.nodes[int(pool.gpu_node[gpus[0]])]
        raise PlacementError(
            f"job {job_id!r}: a {option.kind} option cannot go on node {node.name!r} "
            f"(mode {node.mode!r})"
        )
    return gpus, idx, mode


def _checked_one(
    pool: Pool, option: Option, job_id: str, gpus: tuple[int, ...]
) -> tuple[tuple[int, ...], np.ndarray, int]:
    """:func:`checked_gpus` of a one-GPU option: the same checks and words, on scalars."""
    (g,) = gpus
    if g < 0 or g >= pool.n_gpus:
        raise PlacementError(f"job {job_id!r}: GPU indices {gpus} are invalid for this pool")
    if GPU_NAMES[int(pool.gpu_type[g])] != option.gpu_type:
        raise PlacementError(
            f"job {job_id!r}: GPUs {gpus} are not all {option.gpu_type}; pool has "
            f"{[GPU_NAMES[int(pool.gpu_type[g])]]}"
        )
    mode = MODE_CODES[option.kind]
    k = int(pool.gpu_node[g])
    if pool.gpu_mode[g] != mode and not (mode == MODE_WHOLE and pool.node_whole[k]):
        raise PlacementError(
            f"job {job_id!r}: a {option.kind} option cannot go on node {pool.nodes[k].name!r} "
            f"(mode {pool.nodes[k].mode!r})"
        )
    return gpus, np.array(gpus, np.int64), mode


def slot_use(
    state: PoolState,
    option: Option,
    job_id: str,
    gpus: tuple[int, ...],
    idx: np.ndarray,
    mode: int,
    res: int,
) -> tuple[int, int]:
    """(MiB the slot takes of each GPU, MIG slice mask or 0) when the slot is free on
    ``state`` and holds ``res`` MiB; else why not."""
    if mode == MODE_WHOLE:
        return _whole_use(state, job_id, gpus, idx, res), 0
    if mode == MODE_MIG:
        return _mig_use(state, option, job_id, gpus, res)
    return _shared_use(state, job_id, gpus, res), 0


def _whole_use(
    state: PoolState, job_id: str, gpus: tuple[int, ...], idx: np.ndarray, res: int
) -> int:
    p = state.pool
    if state.busy[idx].any() or state.used_mib[idx].any():
        raise PlacementError(f"job {job_id!r}: GPUs {gpus} are not all idle")
    cap = int(p.capacity_mib[gpus[0]])
    if res > cap:
        type_name = GPU_NAMES[int(p.gpu_type[gpus[0]])]
        raise PlacementError(
            f"job {job_id!r}: reservation {res} MiB exceeds a {type_name} ({cap} MiB)"
        )
    return cap


def _mig_use(
    state: PoolState, option: Option, job_id: str, gpus: tuple[int, ...], res: int
) -> tuple[int, int]:
    if len(gpus) != 1 or option.mig_profile is None or option.mig_start is None:
        raise PlacementError(
            f"job {job_id!r}: a MIG option needs one GPU, a profile and a start slot"
        )
    k, used = state.pool.mig_instance(gpus[0], option.mig_profile, option.mig_start)
    mask = int(state.pool.cand_mask[k])
    if int(state.mig_occ[gpus[0]]) & mask:
        raise PlacementError(
            f"job {job_id!r}: MIG {option.mig_profile}@{option.mig_start} on GPU "
            f"{gpus[0]} overlaps a slice in use"
        )
    if res > used:
        raise PlacementError(
            f"job {job_id!r}: reservation {res} MiB exceeds MIG {option.mig_profile} ({used} MiB)"
        )
    return used, mask


def _shared_use(state: PoolState, job_id: str, gpus: tuple[int, ...], res: int) -> int:
    p = state.pool
    g = gpus[0]
    if len(gpus) != 1:
        raise PlacementError(f"job {job_id!r}: a shared option takes exactly one GPU")
    if state.shared_count[g] >= p.max_shared[g]:
        raise PlacementError(
            f"job {job_id!r}: shared GPU {g} already runs {int(state.shared_count[g])} "
            f"jobs (max_shared_jobs = {int(p.max_shared[g])})"
        )
    free = int(p.capacity_mib[g] - state.used_mib[g])
    if res > free:
        raise PlacementError(f"job {job_id!r}: shared GPU {g} has {free} MiB free, needs {res} MiB")
    return res
