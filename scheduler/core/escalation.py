"""After a CUDA OOM: the reservation the retry asks for, and whether anything bigger exists.

The reservation grows by the shared rule (``scheduler.core.rules.requeue_reservation_gib``:
above the old reservation and above the limit the job died at, its true peak's only known
bound). A job that OOMed on a whole GPU or a MIG slice had all of that slot's memory, so its
retry must get a *bigger* slot: the floor goes past the slot's capacity, and placement
(cheapest option that fits) moves it to the next bigger option the job allows: a bigger slice,
a whole GPU, then a bigger GPU type. On a shared GPU the job had only its MPS limit, so the
grown reservation may still fit there. When no slot of the pool the job may use holds the
floor, it fails at once instead of burning retries on slots that cannot hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.gpus import GPU_NAMES
from scheduler.core.pool import MIB_PER_GIB, Pool
from scheduler.core.rules import memory_limit_gib, requeue_reservation_gib

__all__ = ["Escalation", "escalate_after_oom", "largest_slot_gib"]

# "Just past" a slot's capacity: one MiB, so a reservation that equals a capacity never fits.
_PAST_GIB = 1.0 / MIB_PER_GIB


@dataclass(frozen=True, slots=True)
class Escalation:
    reserved_gib: float  # the retry's reservation floor
    bigger_slot: bool  # the retry must go to a bigger slot than the one that OOMed
    possible: bool  # some slot of the pool the job may use holds it
    reason: str


def largest_slot_gib(pool: Pool, gpu: str | None = None) -> float:
    """The most memory one GPU (whole or shared) of ``pool`` offers, of type ``gpu`` if pinned.

    MIG slices are never larger than their GPU, so whole GPUs bound them.
    """
    types = pool.gpu_type
    mask = np.ones(types.shape, bool) if gpu is None else types == GPU_NAMES.index(gpu)
    if not mask.any():
        return 0.0
    return float(pool.capacity_mib[mask].max()) / MIB_PER_GIB


def escalate_after_oom(
    *,
    label: str,
    kind: str,
    reserved_gib: float,
    capacity_gib: float,
    largest_gib: float,
) -> Escalation:
    """The retry of a job that OOMed on slot ``label`` (``kind`` whole / mig / shared)."""
    grown = requeue_reservation_gib(
        reserved_gib, memory_limit_gib(kind, reserved_gib, capacity_gib)
    )
    had_whole_slot = kind in ("whole", "mig") or (kind == "shared" and grown > capacity_gib)
    new = max(grown, capacity_gib + _PAST_GIB) if had_whole_slot else grown
    if new > largest_gib + 1e-9:
        return Escalation(
            new,
            had_whole_slot,
            False,
            f"CUDA OOM on {label} ({'all of its' if had_whole_slot else 'its reserved'} "
            f"{capacity_gib if had_whole_slot else reserved_gib:.1f} GiB); it needs "
            f"{new:.2f} GiB per GPU and the largest GPU it may use here has {largest_gib:.1f} "
            "GiB: nothing bigger exists (more tensor parallelism would split it: set "
            "`tensor_parallel`/`n_gpus`)",
        )
    if had_whole_slot:
        nxt = {
            "mig": "a larger slice or a whole GPU",
            "whole": "a bigger GPU type",
            "shared": "a whole GPU or a bigger type",
        }[kind]
        return Escalation(
            new,
            True,
            True,
            f"CUDA OOM on {label} with all of its {capacity_gib:.1f} GiB; requeued for a bigger "
            f"slot ({nxt}): reservation {new:.2f} GiB",
        )
    return Escalation(
        new,
        False,
        True,
        f"CUDA OOM on {label}: reserved {reserved_gib:.2f} GiB; requeued with {new:.2f} GiB",
    )
