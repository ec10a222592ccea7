"""``easy_backfill``: Slurm's EASY backfill on the whole GPUs users request.

The queue is FIFO. When the head job cannot start it gets a reservation at the earliest time
running jobs free enough GPUs, judged by the *user's* runtime estimates (Slurm's ``--time``),
falling back to the predicted upper runtime when a job gave none. Later jobs start now only if,
by their own estimates, they end before that reservation or stay off its GPUs.
"""

from __future__ import annotations

import math

from predictor.gpus import GPU_NAMES
from scheduler.core.decision import Option
from scheduler.core.requests import PlacementRequest, RunningJob
from scheduler.policies.registry import PolicyName
from scheduler.policies.requested import RequestedPolicy

__all__ = ["EasyBackfillPolicy"]


class EasyBackfillPolicy(RequestedPolicy):
    """:class:`RequestedPolicy`'s options, backfilled by the users' own runtime estimates."""

    name = PolicyName.EASY_BACKFILL
    backfill = True

    def __init__(self) -> None:
        # FIFO order is backfill's own; there is no strict_fifo knob here.
        pass

    def job_runtime(self, request: PlacementRequest, option: Option) -> float:
        if request.user_runtime_estimate_s is not None:
            return request.user_runtime_estimate_s
        v = float(request.runtime_upper_s[GPU_NAMES.index(option.gpu_type)])
        return v if math.isfinite(v) else math.inf

    def running_end(self, job: RunningJob) -> float:
        if job.user_end_s is not None:
            return job.user_end_s
        if job.request is not None:
            return job.start_s + self.job_runtime(job.request, job.option)
        return job.predicted_end_s
