"""``requested``: today's habit. Whole GPUs of the type the user asked for, reserved whole.

Jobs are taken in queue order; like kube-scheduler, a job that cannot start does not block the
ones behind it (set ``strict_fifo=True`` for head-of-line blocking). MIG slices, shared GPUs and
other types are never used.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.decision import Option
from scheduler.core.options import OptionBatch
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.policies.greedy import GreedyPolicy
from scheduler.policies.registry import PolicyName

__all__ = ["RequestedPolicy"]


class RequestedPolicy(GreedyPolicy):
    name = PolicyName.REQUESTED

    def __init__(self, *, strict_fifo: bool = False) -> None:
        self.strict_fifo = strict_fifo

    def batch(self, pending: Sequence[PlacementRequest], pool: Pool) -> OptionBatch:
        # ``requested_gpu`` comes from core.requests.requested_type, live and simulated.
        return OptionBatch(
            pending,
            pool,
            types=[(r.requested_gpu,) for r in pending],
            kinds=("whole",),
            reserve_whole=True,
            why_excluded=[f"not the requested whole {r.requested_gpu}" for r in pending],
        )

    def chosen_reason(self, option: Option) -> str:
        return f"requested {option.label}, whole GPUs reserved"
