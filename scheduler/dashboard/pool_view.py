"""The pool page's data: per node and GPU, reserved against used VRAM, the MIG layout, and the
job on each slot; free capacity by type (the figures of ``snugfit pool``).

"Used" is what the jobs holding a GPU are predicted to use at their peak (the option's
``vram_gib``): workers measure a job's real peak when it ends, not while it runs, so a live
figure does not exist. The page says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.cli.ops import decoded_allocations, node_state_label, number
from scheduler.cli.render import free_by_type, option_label
from scheduler.core.mig import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES
from scheduler.core.pool import MIB_PER_GIB, MODE_MIG, Pool
from scheduler.exceptions import SchedulerError
from scheduler.service.nodes import node_statuses

__all__ = ["pool_data"]


def pool_data(store: Any, *, now: float, stale_s: float = 15.0) -> dict[str, Any]:
    """Everything the pool page shows, as plain JSON values (also ``/api/pool``).

    ``{"name": None, ...}`` with empty lists before a scheduler has published a pool.
    """
    config = store.pool_config()
    if config is None:
        return {"name": None, "n_gpus": 0, "nodes": [], "free_by_type": {}, "error": None}
    try:
        pool = Pool.from_dict(config)
    except SchedulerError as exc:
        return {"name": None, "n_gpus": 0, "nodes": [], "free_by_type": {}, "error": str(exc)}
    allocs = decoded_allocations(store)
    registered = store.nodes()
    statuses = node_statuses(
        [n.name for n in pool.nodes], registered, store.node_admin(), now=now, stale_s=stale_s
    )
    per_gpu: dict[int, list[tuple[str, Mapping[str, Any]]]] = {}
    for jid, a in sorted(allocations_by_start(allocs)):
        opt = a.get("option") or {}
        for g in a.get("gpus") or opt.get("gpu_indices") or ():
            per_gpu.setdefault(int(g), []).append((jid, a))
    gpu_state = store.gpu_state()
    nodes = []
    for node in pool.nodes:
        held_here = any(per_gpu.get(g) for g in node.gpu_indices)
        st = statuses[node.name]
        gpus = [_gpu(pool, g, per_gpu.get(g, []), gpu_state) for g in node.gpu_indices]
        nodes.append(
            {
                "name": node.name,
                "gpu_type": node.gpu_type,
                "mode": node.mode,
                "state": node_state_label(st.liveness, st.admin, held_here),
                "liveness": st.liveness,
                "why": st.reason,
                "heartbeat_age_s": st.heartbeat_age_s,
                "max_shared_jobs": node.max_shared_jobs if node.mode == "shared" else None,
                "gpus": gpus,
                "reserved_gib": round(sum(g["reserved_gib"] for g in gpus), 3),
                "capacity_gib": round(sum(g["capacity_gib"] for g in gpus), 3),
            }
        )
    return {
        "name": pool.name,
        "n_gpus": pool.n_gpus,
        "nodes": nodes,
        "free_by_type": free_by_type(pool, allocs),
        "jobs_holding_capacity": len(allocs),
        "error": None,
    }


def allocations_by_start(
    allocs: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, Mapping[str, Any]]]:
    """Allocations ordered so a MIG GPU's slices read left to right (by their first slice)."""
    return sorted(
        allocs.items(), key=lambda kv: ((kv[1].get("option") or {}).get("mig_start") or 0, kv[0])
    )


def _gpu(
    pool: Pool,
    g: int,
    held: list[tuple[str, Mapping[str, Any]]],
    gpu_state: Mapping[str, int],
) -> dict[str, Any]:
    cap_mib = int(gpu_state.get(f"{g}:cap", int(pool.capacity_mib[g])))
    slots: list[dict[str, Any]] = []
    for jid, a in held:
        o = a.get("option") or {}
        slots.append(
            {
                "job_id": jid,
                "label": option_label(o),
                "kind": o.get("kind"),
                "reserved_gib": round(int(a.get("reserved_mib", 0)) / MIB_PER_GIB, 3),
                "used_gib": number(o.get("vram_gib")),
                "mig_profile": o.get("mig_profile"),
                "mig_start": o.get("mig_start"),
                "mig_mask": int(a.get("mig_mask") or 0),
                "n_gpus": o.get("n_gpus"),
            }
        )
    reserved = sum(s["reserved_gib"] for s in slots)
    used = sum(s["used_gib"] or 0.0 for s in slots)
    out: dict[str, Any] = {
        "index": g,
        "capacity_gib": round(cap_mib / MIB_PER_GIB, 3),
        "reserved_gib": round(reserved, 3),
        "used_gib": round(used, 3) if slots else None,
        "reserved_frac": min(reserved * MIB_PER_GIB / cap_mib, 1.0) if cap_mib > 0 else 0.0,
        "used_frac": min(used * MIB_PER_GIB / cap_mib, 1.0) if cap_mib > 0 else 0.0,
        "slots": slots,
        "mig": None,
    }
    if int(pool.gpu_mode[g]) == MODE_MIG:
        out["mig"] = _mig_layout(slots, int(gpu_state.get(f"{g}:mig", 0)))
    return out


def _mig_layout(slots: list[dict[str, Any]], mask: int) -> dict[str, Any]:
    """The GPU's eight memory slices, each free or held by one job (runs of one job merge)."""
    owners: list[str | None] = [None] * MIG_MEMORY_SLICES
    profiles: dict[str, str] = {}
    for s in slots:
        memory = s["mig_mask"] >> MIG_COMPUTE_SLICES
        for k in range(MIG_MEMORY_SLICES):
            if memory >> k & 1:
                owners[k] = s["job_id"]
        profiles[s["job_id"]] = str(s["mig_profile"])
    cells: list[dict[str, Any]] = []
    for owner in owners:
        if cells and cells[-1]["job_id"] == owner and owner is not None:
            cells[-1]["width"] += 1
        else:
            cells.append({"job_id": owner, "profile": profiles.get(owner or ""), "width": 1})
    free_compute = MIG_COMPUTE_SLICES - bin(mask & ((1 << MIG_COMPUTE_SLICES) - 1)).count("1")
    free_memory = MIG_MEMORY_SLICES - bin(mask >> MIG_COMPUTE_SLICES).count("1")
    return {
        "cells": cells,
        "free_compute": free_compute,
        "free_memory": free_memory,
        "compute_slices": MIG_COMPUTE_SLICES,
        "memory_slices": MIG_MEMORY_SLICES,
    }
