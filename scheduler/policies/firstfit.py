"""``firstfit``: the first GPU in pool order that holds the job, whatever it costs.

Sizing still uses the predicted upper VRAM bound (so this isolates the effect of the choice
rule from the effect of prediction). Jobs that cannot start do not block later ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.core.decision import Decision
from scheduler.core.placement import OptionBatch, OptionTable, PlacementRequest, RunningJob, greedy_schedule
from scheduler.core.pool import PoolState
from scheduler.policies.base import Policy
from scheduler.policies.registry import PolicyName

__all__ = ["FirstFitPolicy"]


def _first_keys(t: OptionTable) -> tuple[np.ndarray, ...]:
    return (t.size_mib(), t.first())


class FirstFitPolicy(Policy):
    name = PolicyName.FIRSTFIT

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
            batch_for=lambda reqs, pool: OptionBatch(reqs, pool, select="first"),
            keys=_first_keys,
            chosen_reason=lambda o: f"first GPU in pool order that fits: {o.label} on {o.node}",
            loser_reason="first-fit took a GPU earlier in pool order",
            by_cost=False,
        )
