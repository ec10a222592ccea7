"""``easy_backfill``: Slurm's EASY backfill on the whole GPUs users request.

The queue is FIFO. When the head job cannot start it gets a reservation at the earliest time
running jobs free enough GPUs, judged by the *user's* runtime estimates (Slurm's ``--time``),
falling back to the predicted upper runtime when a job gave none. Later jobs start now only if,
by their own estimates, they end before that reservation or stay off its GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.core.decision import Decision, Option
from scheduler.core.placement import OptionBatch, PlacementRequest, RunningJob, greedy_schedule
from scheduler.core.pool import PoolState
from scheduler.policies.base import Policy
from scheduler.policies.registry import PolicyName

__all__ = ["EasyBackfillPolicy"]


def _estimate_s(req: PlacementRequest, option: Option) -> float:
    if req.user_runtime_estimate_s is not None:
        return req.user_runtime_estimate_s
    from predictor.gpus import GPU_NAMES

    v = float(req.runtime_upper_s[GPU_NAMES.index(option.gpu_type)])
    return v if math.isfinite(v) else math.inf


def _end_s(job: RunningJob) -> float:
    if job.user_end_s is not None:
        return job.user_end_s
    if job.request is not None:
        return job.start_s + _estimate_s(job.request, job.option)
    return job.predicted_end_s


class EasyBackfillPolicy(Policy):
    name = PolicyName.EASY_BACKFILL

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
            backfill=True,
            strict_fifo=True,
            job_runtime=_estimate_s,
            running_end=_end_s,
        )
