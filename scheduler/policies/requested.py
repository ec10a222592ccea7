"""``requested``: today's habit. Whole GPUs of the type the user asked for, reserved whole.

Jobs are taken in queue order; like kube-scheduler, a job that cannot start does not block the
ones behind it (set ``strict_fifo=True`` for head-of-line blocking). MIG slices, shared GPUs and
other types are never used.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.decision import Decision
from scheduler.core.placement import OptionBatch, PlacementRequest, RunningJob, greedy_schedule
from scheduler.core.pool import PoolState
from scheduler.policies.base import Policy
from scheduler.policies.registry import PolicyName

__all__ = ["RequestedPolicy"]


class RequestedPolicy(Policy):
    name = PolicyName.REQUESTED

    def __init__(self, *, strict_fifo: bool = False) -> None:
        self.strict_fifo = strict_fifo

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
            batch_for=lambda reqs, pool: OptionBatch(
                reqs,
                pool,
                types=[(r.requested_gpu,) for r in reqs],
                kinds=("whole",),
                reserve_whole=True,
                why_excluded=[f"not the requested whole {r.requested_gpu}" for r in reqs],
            ),
            chosen_reason=lambda o: f"requested {o.label}, whole GPUs reserved",
            strict_fifo=self.strict_fifo,
        )
