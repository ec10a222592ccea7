"""``bestfit``: the slot that leaves the least memory unused (ties: cheaper, then smaller).

Leftover is measured on the GPU the job lands on: a whole GPU's memory minus the reservation, a
MIG slice's memory minus the reservation, or what stays free on a shared GPU. Sizing uses the
predicted upper VRAM bound. Jobs that cannot start do not block later ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.core.decision import Option
from scheduler.core.table import OptionTable
from scheduler.policies.greedy import GreedyPolicy
from scheduler.policies.registry import PolicyName

__all__ = ["BestFitPolicy"]


class BestFitPolicy(GreedyPolicy):
    name = PolicyName.BESTFIT
    loser_reason = "leaves more memory unused than chosen"
    by_cost = False

    def keys(self, table: OptionTable) -> Sequence[np.ndarray]:
        gpus = table.size_mib() // table.capacity_mib
        return (table.size_mib(), table.cost, table.leftover() * gpus)

    def chosen_reason(self, option: Option) -> str:
        return (
            f"least memory left unused: {option.label} on {option.node} "
            f"({option.leftover_gib or 0.0:.1f} GiB left)"
        )
