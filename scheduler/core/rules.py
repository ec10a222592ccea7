"""The rules a killed or failed attempt follows, shared by the live service and the simulator.

One module so that a simulated run is a check on the live path, not a second world: the worker
(:mod:`workers.execute`) and the simulator (:mod:`scheduler.sim.simulator`) both requeue an OOM
with :func:`requeue_reservation_gib`, give up after :data:`MAX_OOM_RETRIES`, and know an OOM'd
peak only as a lower bound: the attempt died at :func:`memory_limit_gib`, so its true peak was at
least that (the history records it as a censored floor, never as a peak).
"""

from __future__ import annotations

from predictor.history import CENSORED_FLOOR_MARGIN

__all__ = [
    "MAX_OOM_RETRIES",
    "MAX_RETRIES",
    "OOM_GROWTH",
    "memory_limit_gib",
    "requeue_reservation_gib",
]

#: A requeued job reserves at least this times its old reservation.
OOM_GROWTH = 1.25
#: OOM kills a job survives; the next one fails it (the store's ``max_oom_retries`` default).
MAX_OOM_RETRIES = 3
#: Lost leases (dead workers, placements never started) a job survives.
MAX_RETRIES = 2


def memory_limit_gib(kind: str, reserved_gib: float, capacity_gib: float) -> float:
    """What an attempt can really allocate: a whole GPU or a MIG slice is all its own (nothing
    caps a process below the device's memory); on a shared GPU the worker sets the MPS limit to
    the reservation."""
    return reserved_gib if kind == "shared" else capacity_gib


def requeue_reservation_gib(reserved_gib: float, limit_gib: float) -> float:
    """The reservation after an OOM: above the old one, and above the limit the job died at
    (its true peak was at least that), by the same margin the history's floors use."""
    return max(OOM_GROWTH * reserved_gib, (1.0 + CENSORED_FLOOR_MARGIN) * limit_gib)
