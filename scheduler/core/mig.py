"""MIG slice geometry.

MIG follows the NVIDIA MIG user guide's placement model for the 7-compute / 8-memory-slice GPUs
(A100, H100, H200, B200): a profile placed at start slot ``s`` takes compute slices
``[s, s + compute_slices)`` and memory slices ``[s, s + memory_slices)``; it may start only at the
slots its profile lists. A GPU's occupancy is one 15-bit mask (7 compute bits, then 8 memory
bits), so "is this slice free" is one AND. A static layout fixes which (profile, start) instances
exist; ``mig = "dynamic"`` lets any valid instance be created on demand when its slices are free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.exceptions import UnknownGpuError
from predictor.gpus import GpuType, MigProfile
from scheduler.exceptions import PoolError

if TYPE_CHECKING:
    from scheduler.core.pool import NodeConfig, Pool

__all__ = [
    "MIG_COMPUTE_SLICES",
    "MIG_MEMORY_SLICES",
    "mig_instances",
    "mig_mask",
    "place_layout",
    "popcount15",
    "static_layout",
]


MIG_COMPUTE_SLICES = 7


MIG_MEMORY_SLICES = 8


_POPCOUNT = np.array([bin(i).count("1") for i in range(1 << 15)], dtype=np.int8)


def popcount15(masks: np.ndarray) -> np.ndarray:
    return _POPCOUNT[masks & ((1 << 15) - 1)]


def mig_mask(profile: MigProfile, start: int) -> int:
    compute = ((1 << profile.compute_slices) - 1) << start
    memory = ((1 << profile.memory_slices) - 1) << start
    return compute | (memory << MIG_COMPUTE_SLICES)


def static_layout(nc: NodeConfig, gpu: GpuType) -> tuple[tuple[tuple[str, int], ...], ...]:
    assert nc.mig is not None and nc.mig != "dynamic"
    raw = nc.mig
    per_gpu: list[list[str]]
    if all(isinstance(x, str) for x in raw):
        per_gpu = [list(raw)] * nc.count  # type: ignore[arg-type]
    else:
        per_gpu = [list(x) for x in raw]  # type: ignore[arg-type]
        if len(per_gpu) != nc.count:
            raise PoolError(
                f"node {nc.name!r}: mig layout lists {len(per_gpu)} GPUs but count = {nc.count}; "
                "give one list per GPU or a single list for all"
            )
    out: list[tuple[tuple[str, int], ...]] = []
    for g, names in enumerate(per_gpu):
        wanted: list[tuple[MigProfile, int | None]] = []
        for item in names:
            name, sep, start_s = item.partition("@")
            try:
                prof = gpu.mig_profile(name.strip())
            except UnknownGpuError as exc:
                raise PoolError(f"node {nc.name!r} GPU {g}: {exc}") from None
            start: int | None = None
            if sep:
                try:
                    start = int(start_s)
                except ValueError:
                    raise PoolError(
                        f"node {nc.name!r} GPU {g}: bad MIG start {item!r}; write e.g. '1g.10gb@6'"
                    ) from None
                if start not in prof.placements:
                    raise PoolError(
                        f"node {nc.name!r} GPU {g}: {prof.name} cannot start at slot {start}; "
                        f"valid starts are {list(prof.placements)}"
                    )
            wanted.append((prof, start))
        placed = place_layout(wanted)
        if placed is None:
            raise PoolError(
                f"node {nc.name!r} GPU {g}: MIG layout {names} does not fit one {gpu.name} "
                "under NVIDIA's placement rules (7 compute / 8 memory slices); drop or shrink "
                "a profile"
            )
        out.append(tuple(placed))
    return tuple(out)


def place_layout(
    wanted: list[tuple[MigProfile, int | None]],
) -> list[tuple[str, int]] | None:
    """Assign start slots by depth-first search, biggest profiles first; None if impossible."""
    order = sorted(
        range(len(wanted)),
        key=lambda i: (-wanted[i][0].compute_slices, -wanted[i][0].memory_slices, i),
    )
    starts: dict[int, int] = {}

    def dfs(k: int, occ: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        prof, fixed = wanted[i]
        for s in (fixed,) if fixed is not None else prof.placements:
            m = mig_mask(prof, s)
            if occ & m == 0:
                starts[i] = s
                if dfs(k + 1, occ | m):
                    return True
        return False

    if not dfs(0, 0):
        return None
    return [(wanted[i][0].name, starts[i]) for i in range(len(wanted))]


def mig_instances(pool: Pool) -> dict[tuple[int, str | None, int], tuple[int, int]]:
    """Per (GPU, profile, start slot), the (candidate index, slice MiB) of that MIG instance:
    every candidate once, the lowest index first (what a scan of the candidates finds first);
    :meth:`Pool.mig_instance <scheduler.core.pool.Pool.mig_instance>` reads it."""
    out: dict[tuple[int, str | None, int], tuple[int, int]] = {}
    cls = pool.cand_class.tolist()
    for k, (g, s) in enumerate(zip(pool.cand_gpu.tolist(), pool.cand_start.tolist(), strict=True)):
        key = (g, pool.class_profile[cls[k]], s)
        if key not in out:
            out[key] = (k, int(pool.class_capacity_mib[cls[k]]))
    return out
