"""``firstfit``: the first GPU in pool order that holds the job, whatever it costs.

Sizing still uses the predicted upper VRAM bound (so this isolates the effect of the choice
rule from the effect of prediction). Jobs that cannot start do not block later ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.core.decision import Option
from scheduler.core.table import OptionTable
from scheduler.policies.greedy import GreedyPolicy
from scheduler.policies.registry import PolicyName

__all__ = ["FirstFitPolicy"]


class FirstFitPolicy(GreedyPolicy):
    name = PolicyName.FIRSTFIT
    select = "first"
    loser_reason = "first-fit took a GPU earlier in pool order"
    by_cost = False

    def keys(self, table: OptionTable) -> Sequence[np.ndarray]:
        return (table.size_mib(), table.first())

    def chosen_reason(self, option: Option) -> str:
        return f"first GPU in pool order that fits: {option.label} on {option.node}"
