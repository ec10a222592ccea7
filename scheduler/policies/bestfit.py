"""``bestfit``: the slot that leaves the least memory unused (ties: cheaper, then smaller).

Leftover is measured on the GPU the job lands on: a whole GPU's memory minus the reservation, a
MIG slice's memory minus the reservation, or what stays free on a shared GPU. Sizing uses the
predicted upper VRAM bound. Jobs that cannot start do not block later ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.core.decision import Decision
from scheduler.core.placement import OptionTable, PlacementRequest, RunningJob, greedy_schedule
from scheduler.core.pool import PoolState
from scheduler.policies.base import Policy
from scheduler.policies.registry import PolicyName

__all__ = ["BestFitPolicy"]


def _leftover_keys(t: OptionTable) -> tuple[np.ndarray, ...]:
    gpus = t.size_mib() // t.capacity_mib
    return (t.size_mib(), t.cost, t.leftover() * gpus)


class BestFitPolicy(Policy):
    name = PolicyName.BESTFIT

    def schedule(
        self,
        pending: Sequence[PlacementRequest],
        state: PoolState,
        now_s: float,
        running: Sequence[RunningJob] = (),
    ) -> list[Decision]:
        return greedy_schedule(
            pending,
            state,
            now_s,
            running,
            policy=self.name.value,
            keys=_leftover_keys,
            chosen_reason=lambda o: (
                f"least memory left unused: {o.label} on {o.node} "
                f"({o.leftover_gib or 0.0:.1f} GiB left)"
            ),
            loser_reason="leaves more memory unused than chosen",
            by_cost=False,
        )
