"""Discrete-event simulator: the shared :class:`~scheduler._core.SchedulerCore` on virtual time.

Events are arrivals, finishes and OOM kills, kept in a heap. At each event time the simulator
applies every event due, then ticks the core once; the core and the policy are exactly what the
live service runs (no simulation branches anywhere).

Ground truth is not the predictor: each job's true per-GPU peak VRAM and runtime are the
analytical figures times factors drawn from :mod:`scheduler.truth` (measured residuals). A job
whose true peak exceeds its reservation is OOM-killed at a uniformly random point of its run
and requeued with ``max(observed peak, 1.25 x old reservation)``, where the observed peak is
the true one: a killed CUDA allocation reports the size it failed at.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES, get_gpu
from predictor.prediction import PredictionTable

from ._core import SchedulerCore
from .clock import VirtualClock
from .decision import Decision, Option
from .exceptions import SimulationError
from .metrics import AttemptRecords, JobRecords, SimulationMetrics, compute_metrics
from .placement import PlacementRequest, cheapest_index, enumerate_options
from .policies.base import Policy
from .pool import Pool
from .truth import ResidualModel, load_residuals
from .workload import Workload

__all__ = ["OOM_GROWTH", "SimulationResult", "Simulator", "simulate"]

OOM_GROWTH = 1.25  # a requeued job reserves at least this times its old reservation
_ARRIVAL, _FINISH, _OOM = 0, 1, 2
_TYPE_INDEX = {n: i for i, n in enumerate(GPU_NAMES)}


@dataclass
class _Job:
    request: PlacementRequest
    arrival_s: float
    vram_factor: float
    runtime_factor: float
    first_start_s: float = math.nan
    end_s: float = math.nan
    oom_kills: int = 0
    rejected: bool = False
    attempt_start_s: float = math.nan
    option: Option | None = None
    event_seq: int = -1  # the live finish/OOM event; stale ones are skipped

    def true_peak_gib(self, gpu_type: str) -> float:
        return float(self.request.vram_gib[_TYPE_INDEX[gpu_type]]) * self.vram_factor


@dataclass
class SimulationResult:
    policy: str
    metrics: SimulationMetrics
    wall_s: float
    decisions: int
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            **self.metrics.to_dict(),
            "wall_s": round(self.wall_s, 3),
            "decisions": self.decisions,
        }


def _requested_type(upper: np.ndarray, n_gpus: int, wanted: str) -> str:
    """The user's pick if the job fits it, else the smallest type that does (users upsize)."""
    if upper[_TYPE_INDEX[wanted]] <= get_gpu(wanted).memory_gib:
        return wanted
    by_size = sorted(GPU_NAMES, key=lambda n: get_gpu(n).memory_gib)
    for name in by_size:
        if upper[_TYPE_INDEX[name]] <= get_gpu(name).memory_gib:
            return name
    return by_size[-1]


class Simulator:
    """One policy on one pool for one workload; :meth:`run` returns the metrics."""

    def __init__(
        self,
        pool: Pool,
        policy: Policy,
        workload: Workload,
        predictions: PredictionTable,
        *,
        seed: int = 0,
        residuals: ResidualModel | None = None,
        smallest_fit: bool = True,
    ) -> None:
        if len(predictions) != len(workload):
            raise SimulationError(
                f"predictions have {len(predictions)} rows but the workload has "
                f"{len(workload)} jobs; predict the same specs in the same order"
            )
        self.pool = pool
        self.policy = policy
        self.clock = VirtualClock(0.0)
        self.core = SchedulerCore(pool.state(), policy, self.clock)
        self.smallest_fit = smallest_fit
        rng = np.random.default_rng(seed)
        # Independent stream for OOM points, so the truth draws match across policies.
        self._rng_oom = np.random.default_rng([seed, 1])
        model = residuals if residuals is not None else load_residuals()
        vf, rf = model.sample(len(workload), rng)
        self.jobs: dict[str, _Job] = {}
        self._order: list[str] = []
        for i, spec in enumerate(workload.specs):
            req = PlacementRequest.from_table(
                spec, predictions, i, submit_time_s=float(workload.arrival_s[i])
            )
            req.requested_gpu = _requested_type(
                req.vram_upper_gib, req.n_gpus, workload.requested_gpu[i]
            )
            jid = req.job_id
            if jid in self.jobs:
                raise SimulationError(f"duplicate job id {jid!r} in the workload")
            self.jobs[jid] = _Job(req, float(workload.arrival_s[i]), float(vf[i]), float(rf[i]))
            self._order.append(jid)
        self._heap: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._attempts: list[tuple[float, float, float, float, float]] = []
        self._placed = 0
        self._decisions = 0

    def _push(self, t: float, kind: int, jid: str) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, jid))
        return self._seq

    def _record_attempt(self, job: _Job, end_s: float) -> None:
        opt = job.option
        assert opt is not None
        dur = max(end_s - job.attempt_start_s, 0.0)
        full = opt.runtime_s if opt.runtime_s else math.inf
        cost = (opt.cost_usd or 0.0) * (dur / (full * job.runtime_factor))
        price = self.pool.price_for(opt.gpu_type)
        slot = opt.capacity_gib * opt.n_gpus
        used = min(job.true_peak_gib(opt.gpu_type), opt.capacity_gib) * opt.n_gpus
        self._attempts.append((dur, cost, cost / price, slot, used))

    def _start(self, d: Decision, now: float) -> None:
        job = self.jobs[d.job_id]
        opt = d.chosen_option
        assert opt is not None
        job.option = opt
        job.attempt_start_s = now
        if math.isnan(job.first_start_s):
            job.first_start_s = now
        runtime = (opt.runtime_s if opt.runtime_s is not None else math.inf) * job.runtime_factor
        if job.true_peak_gib(opt.gpu_type) > opt.reserved_gib + 1e-9:
            kill_at = now + float(self._rng_oom.random()) * runtime
            job.event_seq = self._push(kill_at, _OOM, d.job_id)
        else:
            job.event_seq = self._push(now + runtime, _FINISH, d.job_id)

    def run(self) -> SimulationResult:
        t0 = time.perf_counter()
        for jid in self._order:
            self._push(self.jobs[jid].arrival_s, _ARRIVAL, jid)
        core = self.core
        while self._heap:
            now = self._heap[0][0]
            self.clock.advance_to(now)
            while self._heap and self._heap[0][0] <= now:
                _, seq, kind, jid = heapq.heappop(self._heap)
                job = self.jobs[jid]
                if kind == _ARRIVAL:
                    core.submit(job.request)
                elif seq != job.event_seq:
                    continue
                elif kind == _FINISH:
                    self._record_attempt(job, now)
                    core.finish(jid)
                    job.end_s = now
                else:
                    self._record_attempt(job, now)
                    assert job.option is not None
                    observed = job.true_peak_gib(job.option.gpu_type)
                    new = max(observed, OOM_GROWTH * job.option.reserved_gib)
                    job.request = core.oom(jid, new)
                    job.oom_kills += 1
                    job.option = None
            for d in core.tick(now):
                self._decisions += 1
                if d.state == "placed":
                    self._placed += 1
                    self._start(d, now)
                elif d.state == "rejected":
                    self.jobs[d.job_id].rejected = True
        return SimulationResult(
            policy=str(self.policy.name),
            metrics=self._metrics(),
            wall_s=time.perf_counter() - t0,
            decisions=self._decisions,
        )

    def _smallest_fit(self, job: _Job) -> bool:
        """Whether the job's final option is the cheapest one that holds its TRUE peak."""
        if job.option is None and not np.isfinite(job.end_s):
            return False
        truth = job.request.vram_gib * job.vram_factor
        probe = PlacementRequest(
            job_id=job.request.job_id,
            vram_gib=truth,
            vram_upper_gib=truth,
            runtime_s=job.request.runtime_s,
            runtime_upper_s=job.request.runtime_upper_s,
            n_gpus=job.request.n_gpus,
            tensor_parallel=job.request.tensor_parallel,
            pipeline_parallel=job.request.pipeline_parallel,
            gpu=job.request.gpu,
        )
        opts = enumerate_options(probe, self._empty)
        i = cheapest_index(opts, now=False)
        if i is None or job.option is None:
            return False
        best, got = opts[i], job.option
        return bool(
            best.gpu_type == got.gpu_type
            and best.kind == got.kind
            and best.mig_profile == got.mig_profile
            and best.n_gpus == got.n_gpus
        )

    def _metrics(self) -> SimulationMetrics:
        self._empty = self.pool.state()
        rows = [self.jobs[j] for j in self._order]
        n = len(rows)
        reserved = np.full(n, np.nan)
        peak = np.full(n, np.nan)
        smallest = np.zeros(n, bool)
        for i, job in enumerate(rows):
            if job.option is not None and np.isfinite(job.end_s):
                reserved[i] = job.option.reserved_gib
                peak[i] = job.true_peak_gib(job.option.gpu_type)
                if self.smallest_fit:
                    smallest[i] = self._smallest_fit(job)
        jobs = JobRecords(
            arrival_s=np.array([j.arrival_s for j in rows]),
            first_start_s=np.array([j.first_start_s for j in rows]),
            end_s=np.array([j.end_s for j in rows]),
            oom_kills=np.array([j.oom_kills for j in rows], np.int64),
            rejected=np.array([j.rejected for j in rows], bool),
            smallest_fit=smallest,
            reserved_gib=reserved,
            true_peak_gib=peak,
        )
        a = np.asarray(self._attempts, float).reshape(-1, 5)
        attempts = AttemptRecords(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])
        return compute_metrics(
            jobs,
            attempts,
            pool_gpus=self.pool.n_gpus,
            placement_seconds=self.core.counters.placement_seconds,
            n_placements=self._placed,
        )


def simulate(
    pool: Pool,
    policies: Sequence[str],
    workload: Workload,
    *,
    seed: int = 0,
    predictions: PredictionTable | None = None,
    residuals: ResidualModel | None = None,
    smallest_fit: bool = True,
) -> list[SimulationResult]:
    """Run several policies on the same workload and the same truth draws."""
    from predictor.analytical import predict_table

    from .policies.registry import get_policy

    table = predictions if predictions is not None else predict_table(list(workload.specs))
    out = []
    for name in policies:
        sim = Simulator(
            pool,
            get_policy(name),
            workload,
            table,
            seed=seed,
            residuals=residuals,
            smallest_fit=smallest_fit,
        )
        out.append(sim.run())
    return out
