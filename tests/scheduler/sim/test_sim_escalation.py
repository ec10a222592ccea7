"""The simulator escalates an OOM by the live rule (scheduler.core.escalation): more tensor
parallelism where the spec permits it, failure at once where nothing bigger exists."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from predictor.analytical import predict_table
from predictor.history import fingerprint
from predictor.spec import parse_spec
from scheduler.core.pool import Pool
from scheduler.policies.registry import get_policy
from scheduler.sim.simulator import Simulator
from scheduler.sim.truth import ResidualModel
from scheduler.sim.workload import Workload
from tests.jobs import BIG_70B_FP8

POOL = {"name": "p", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 2}]}
BIG = BIG_70B_FP8


def _truth(vram_factor: float) -> ResidualModel:
    """Every job's true peak is ``vram_factor`` x the predictor's (runtime as predicted)."""
    levels = np.array([0.0, 1.0])
    return ResidualModel(
        levels, np.full(2, math.log(vram_factor)), np.zeros(2), {"source": "test constant"}
    )


def _run(*specs: dict[str, Any]) -> Simulator:
    parsed = tuple(parse_spec(s) for s in specs)
    wl = Workload(
        specs=parsed,
        arrival_s=np.zeros(len(parsed)),
        requested_gpu=("H100-80GB",) * len(parsed),
        job_class=("batch",) * len(parsed),
        fingerprint=tuple(f"once-{i}" for i in range(len(parsed))),
    )
    sim = Simulator(
        Pool.from_dict(POOL),
        get_policy("rightsize"),
        wl,
        predict_table(list(parsed)),
        residuals=_truth(1.3),  # 1.3 x 70 GiB: more than an H100 at TP=1, ~47 GiB at TP=2
    )
    sim.run()
    return sim


def test_a_job_that_no_gpu_holds_reruns_at_twice_the_tensor_parallelism() -> None:
    sim = _run(BIG | {"id": "big", "max_tensor_parallel": 2})
    job = sim.jobs["big"]
    assert job.oom_kills == 1 and not job.failed and math.isfinite(job.end_s)
    assert job.spec is not None and (job.spec.tensor_parallel, job.spec.n_gpus) == (2, 2)
    assert job.option is not None and job.option.n_gpus == 2
    # Its truth is drawn for the new spec, as a --simulate worker draws it from the record.
    assert job.fingerprint == fingerprint(job.spec)
    assert job.true_peak_gib("H100-80GB") <= job.option.reserved_gib


def test_without_permission_or_room_it_fails_at_once() -> None:
    sim = _run(BIG | {"id": "plain"}, BIG | {"id": "capped", "max_tensor_parallel": 1})
    for jid in ("plain", "capped"):
        job = sim.jobs[jid]
        assert job.failed and job.oom_kills == 1 and not math.isfinite(job.end_s)
