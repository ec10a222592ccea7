"""Discrete-event simulator: the shared :class:`~scheduler.core.loop.SchedulerCore` on virtual time.

Events are arrivals, finishes and OOM kills, kept in a heap. At each event time the simulator
applies every event due, then ticks the core once; the core and the policy are exactly what the
live service runs (no simulation branches anywhere).

Ground truth is not the predictor: each job's true per-GPU peak VRAM and runtime are the
analytical figures times factors from :func:`scheduler.sim.truth.draw_truth` (measured residuals,
one systematic error per fingerprint of the spec, :func:`predictor.history.fingerprint`, plus a
run-to-run noise per job id, all keyed by the seed), the very function ``--simulate`` workers
call, so a live demo and its simulation run on the same truth. A job whose true peak exceeds what
it can allocate (:func:`scheduler.core.rules.memory_limit_gib`) is OOM-killed at the point
:func:`~scheduler.sim.truth.oom_fraction` says and requeued by the live rules
(:mod:`scheduler.core.rules`: the reservation grows past the limit it died at; after
``MAX_OOM_RETRIES`` requeues the job fails) and the live escalation
(:func:`scheduler.core.escalation.escalate_oom`: a bigger slot, then more tensor parallelism
where the spec permits it, re-predicted with ``predict``, else failure at once). A job
requeued at a higher degree is a new fingerprint: its truth is drawn for that spec, as a
``--simulate`` worker draws it from the spec in the job record.

With ``feedback`` the simulator does what the live leader does with its history: every outcome
is recorded per fingerprint (:class:`~scheduler.core.history.RequestHistory`): a finished run
as measured / predicted ratios, an OOM as a censored floor (its limit: the live worker knows no
more), and a later submission of that fingerprint is predicted from it, Autopilot-style.

By default the core ticks at every event time (exact). ``tick_interval_s`` > 0 runs it at most
once per interval instead, at interval boundaries, as Slurm's main scheduler does
(``sched_interval``, 60 s by default): jobs wait up to one interval more, and a huge simulation
makes far fewer passes over its queue.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from predictor.gpus import GPU_NAMES
from predictor.history import fingerprint
from predictor.prediction import PredictionTable
from predictor.spec import JobSpec
from scheduler.core.clock import VirtualClock
from scheduler.core.decision import Decision, Option
from scheduler.core.escalation import TableFn, escalate_oom
from scheduler.core.loop import SchedulerCore
from scheduler.core.options import OptionBatch
from scheduler.core.pool import KIND_NAMES, Pool
from scheduler.core.requests import (
    TYPE_INDEX,
    PlacementRequest,
    gradient_syncs,
    host_floor_gib,
    probe_request,
    requested_types,
    requests_from_table,
)
from scheduler.core.rules import MAX_OOM_RETRIES, OOM_GROWTH, memory_limit_gib
from scheduler.exceptions import SimulationError
from scheduler.policies.base import Policy
from scheduler.sim.feedback import FeedbackHistory
from scheduler.sim.outcomes import AttemptRecords, JobRecords, SimulationMetrics, compute_metrics
from scheduler.sim.truth import (
    RUN_NOISE_RUNTIME_SIGMA,
    RUN_NOISE_VRAM_SIGMA,
    ResidualModel,
    draw_truth,
    load_residuals,
    oom_fraction,
)
from scheduler.sim.workload import Workload, distinct_rows, predict_workload

__all__ = [
    "OOM_GROWTH",
    "RUN_NOISE_RUNTIME_SIGMA",
    "RUN_NOISE_VRAM_SIGMA",
    "Observer",
    "SimulationResult",
    "Simulator",
    "simulate",
]

_ARRIVAL, _FINISH, _OOM, _TICK = 0, 1, 2, 3


@dataclass
class _Job:
    request: PlacementRequest
    fingerprint: str
    arrival_s: float
    vram_factor: float
    runtime_factor: float
    first_start_s: float = math.nan
    end_s: float = math.nan
    oom_kills: int = 0
    rejected: bool = False
    failed: bool = False  # gave up after MAX_OOM_RETRIES, as the live store does
    attempt_start_s: float = math.nan
    option: Option | None = None
    event_seq: int = -1  # the live finish/OOM event; stale ones are skipped
    from_history: bool = False
    base: PlacementRequest | None = None  # the predictor's request, before any history
    spec: JobSpec | None = None  # as submitted, or as an OOM retry re-split it

    def true_peak_gib(self, gpu_type: str) -> float:
        # Truth scales the predictor's own figure, never a history-adjusted one.
        assert self.base is not None
        return float(self.base.vram_gib[TYPE_INDEX[gpu_type]]) * self.vram_factor

    def true_runtime_s(self, option: Option) -> float:
        """The attempt's true full runtime on ``option`` (MIG/shared slow-downs included)."""
        assert self.base is not None
        if option.runtime_s is None:
            return math.inf
        t = TYPE_INDEX[option.gpu_type]
        own, base = float(self.request.runtime_s[t]), float(self.base.runtime_s[t])
        # option.runtime_s = own x the option's slow-down; the truth is base x slow-down x error.
        scale = base / own if own > 0 and math.isfinite(own) else 1.0
        return option.runtime_s * scale * self.runtime_factor


# Called after every tick with (core, decisions of the tick, now): tests check invariants here.
Observer = Callable[[SchedulerCore, list[Decision], float], None]


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
            **self.extras,
            "wall_s": round(self.wall_s, 3),
            "decisions": self.decisions,
        }


def _limit_gib(option: Option) -> float:
    return memory_limit_gib(option.kind, option.reserved_gib, option.capacity_gib)


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
        feedback: bool = False,
        history: FeedbackHistory | None = None,
        observer: Observer | None = None,
        tick_interval_s: float = 0.0,
        predict: TableFn | None = None,
    ) -> None:
        if tick_interval_s < 0:
            raise SimulationError(
                f"tick_interval_s must be >= 0 (0: schedule at every event); got {tick_interval_s}"
            )
        self.tick_interval_s = float(tick_interval_s)
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
        self.feedback = feedback
        self.history = history if history is not None else FeedbackHistory()
        self.observer = observer
        self.seed = int(seed)
        model = residuals if residuals is not None else load_residuals()
        self._residuals = model
        # What an OOM retry at a higher tensor parallel degree is re-predicted with.
        self.predict: TableFn = predict if predict is not None else _analytical
        n = len(workload)
        # The spec's fingerprint, as the live path computes it: truth and history are keyed by
        # it (the workload's template names are not visible to a worker).
        fps = _fingerprints(workload)
        ids = [s.id or f"job-{i}" for i, s in enumerate(workload.specs)]
        vf, rf = draw_truth(model, self.seed, fps, ids) if n else (np.ones(0), np.ones(0))
        self.jobs: dict[str, _Job] = {}
        self._order: list[str] = []
        specs = workload.specs
        reqs = _requests(workload, predictions, pool)
        for i, (spec, req) in enumerate(zip(specs, reqs, strict=True)):
            jid = req.job_id
            if jid in self.jobs:
                raise SimulationError(f"duplicate job id {jid!r} in the workload")
            self.jobs[jid] = _Job(
                req,
                fps[i],
                float(workload.arrival_s[i]),
                float(vf[i]),
                float(rf[i]),
                base=req,
                spec=spec,
            )
            self._order.append(jid)
        self._heap: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._attempts: list[tuple[float, float, float, float, float]] = []
        self._placed = 0
        self._decisions = 0
        self._placement_log: list[tuple[str, float, float]] = []

    def _push(self, t: float, kind: int, jid: str) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, jid))
        return self._seq

    def _record_attempt(self, job: _Job, end_s: float) -> None:
        opt = job.option
        assert opt is not None
        dur = max(end_s - job.attempt_start_s, 0.0)
        full = opt.runtime_s if opt.runtime_s else math.inf
        # The option's price per second of holding it, for as long as it was really held.
        cost = (opt.cost_usd or 0.0) * (dur / full)
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
        upper = float(job.request.vram_upper_gib[TYPE_INDEX[opt.gpu_type]])
        self._placement_log.append((d.job_id, opt.reserved_gib, upper))
        if math.isnan(job.first_start_s):
            job.first_start_s = now
        runtime = job.true_runtime_s(opt)
        if job.true_peak_gib(opt.gpu_type) > _limit_gib(opt) + 1e-9:
            attempt = job.oom_kills + 1
            kill_at = now + oom_fraction(self.seed, d.job_id, attempt) * runtime
            job.event_seq = self._push(kill_at, _OOM, d.job_id)
        else:
            job.event_seq = self._push(now + runtime, _FINISH, d.job_id)

    def run(self) -> SimulationResult:
        t0 = time.perf_counter()
        self._loop()
        rows = [self.jobs[j] for j in self._order]
        return SimulationResult(
            policy=str(self.policy.name),
            metrics=self._metrics(),
            wall_s=time.perf_counter() - t0,
            decisions=self._decisions,
            extras={
                "feedback": self.feedback,
                "jobs_predicted_from_history": sum(j.from_history for j in rows),
                "oom_kills_history": sum(j.oom_kills for j in rows if j.from_history),
                "oom_kills_no_history": sum(j.oom_kills for j in rows if not j.from_history),
            },
        )

    def _arrivals(self) -> tuple[list[float], list[str]]:
        """Arrival times and job ids in the order a heap of (time, submission order) pops
        them: by time, ties in submission order."""
        jobs = self.jobs
        t = np.fromiter((jobs[j].arrival_s for j in self._order), np.float64, len(self._order))
        if not np.isfinite(t).all():
            raise SimulationError("arrival times must be finite seconds")
        order = np.argsort(t, kind="stable").tolist()
        return t[order].tolist(), [self._order[i] for i in order]

    def _loop(self) -> None:
        """Every event in (time, order) order, then one tick per event time (or interval).

        Arrivals come from one sorted list rather than the heap: each would have been pushed
        before any other event, so at equal times it comes first, as it does here. The heap
        holds only finishes, OOM kills and ticks (what is running, not what is yet to come).
        """
        arr_t, arr_id = self._arrivals()
        n_arr, a = len(arr_t), 0
        heap, pop, inf = self._heap, heapq.heappop, math.inf
        interval = self.tick_interval_s
        tick_due = False  # a _TICK event is in the heap (interval mode)
        while heap or a < n_arr:
            next_a = arr_t[a] if a < n_arr else inf
            now = next_a if not heap or next_a <= heap[0][0] else heap[0][0]
            self.clock.advance_to(now)
            tick_now = interval == 0.0
            while True:
                next_a = arr_t[a] if a < n_arr else inf
                if next_a <= now and (not heap or next_a <= heap[0][0]):
                    kind, seq, jid = _ARRIVAL, 0, arr_id[a]
                    a += 1
                elif heap and heap[0][0] <= now:
                    _, seq, kind, jid = pop(heap)
                else:
                    break
                if kind == _TICK:
                    tick_now, tick_due = True, False
                    continue
                if interval and not tick_due:
                    # Slurm-style scheduling interval: events land as they come, the
                    # scheduler runs at the next interval boundary.
                    self._push(math.ceil(now / interval) * interval, _TICK, "")
                    tick_due = True
                job = self.jobs[jid]
                if kind == _ARRIVAL:
                    self._arrive(job)
                elif seq != job.event_seq:
                    continue
                elif kind == _FINISH:
                    self._finished(job, jid, now)
                else:
                    self._oom(job, jid, now)
            if tick_now:
                self._tick(now)

    def _arrive(self, job: _Job) -> None:
        if self.feedback:
            assert job.base is not None
            hist = self.history.apply(job.fingerprint, job.base)
            if hist is not None:
                job.request, n_runs = hist
                job.from_history = n_runs > 0
        self.core.submit(job.request)

    def _finished(self, job: _Job, jid: str, now: float) -> None:
        self._record_attempt(job, now)
        self.core.finish(jid)
        job.end_s = now
        assert job.option is not None
        # Ratios to the predictor's own figures, whatever the history said.
        self.history.record_run(
            job.fingerprint, job.option.gpu_type, job.vram_factor, job.runtime_factor
        )

    def _tick(self, now: float) -> None:
        decisions = self.core.tick(now)
        for d in decisions:
            self._decisions += 1
            if d.state == "placed":
                self._placed += 1
                self._start(d, now)
            elif d.state == "rejected":
                self.jobs[d.job_id].rejected = True
        if self.observer is not None:
            self.observer(self.core, decisions, now)

    def _oom(self, job: _Job, jid: str, now: float) -> None:
        """An OOM kill, by the live rules: the history learns only that the peak was at least
        the limit (censored), the job requeues above that limit or fails after the cap."""
        self._record_attempt(job, now)
        opt = job.option
        assert opt is not None and job.base is not None
        limit = _limit_gib(opt)
        base = float(job.base.vram_gib[TYPE_INDEX[opt.gpu_type]])
        self.history.record_oom(job.fingerprint, opt.gpu_type, limit / base if base > 0 else None)
        job.oom_kills += 1
        esc = escalate_oom(
            label=opt.label,
            kind=opt.kind,
            reserved_gib=opt.reserved_gib,
            capacity_gib=opt.capacity_gib,
            gpu_type=opt.gpu_type,
            pool=self.pool,
            spec=job.spec,
            predict=self.predict,
            job_id=jid,
            submit_time_s=job.request.submit_time_s,
            requested_gpu=job.request.requested_gpu,
        )
        if job.oom_kills > MAX_OOM_RETRIES or not esc.possible:
            self.core.finish(jid)
            job.failed, job.option = True, None
            return
        retry = esc.tensor_parallel
        job.request = self.core.oom(jid, esc.reserved_gib, None if retry is None else retry.request)
        job.option = None
        if retry is not None:
            # A new layout is a new job to the truth and the history, as on a live worker.
            job.spec, job.base = retry.spec, retry.request
            job.fingerprint = fingerprint(retry.spec)
            vf, rf = draw_truth(self._residuals, self.seed, [job.fingerprint], [jid])
            job.vram_factor, job.runtime_factor = float(vf[0]), float(rf[0])

    @property
    def placement_log(self) -> list[tuple[str, float, float]]:
        """(job id, reserved GiB per GPU, predicted upper GiB on that type) per placement."""
        return list(self._placement_log)

    def _smallest_fit(self, rows: Sequence[_Job]) -> np.ndarray:
        """Per job, whether its final option is the cheapest one that holds its TRUE peak on
        an empty pool (the probes go through :class:`OptionBatch` in chunks: one vectorised
        enumeration per chunk, the same answer as one option table per job)."""
        out = np.zeros(len(rows), bool)
        pool = self.pool
        for lo in range(0, len(rows), _SMALLEST_FIT_CHUNK):
            chunk = rows[lo : lo + _SMALLEST_FIT_CHUNK]
            cheapest = OptionBatch([_truth_probe(j) for j in chunk], pool)._cheapest_empty
            for k, (job, c) in enumerate(zip(chunk, cheapest, strict=True)):
                got = job.option
                out[lo + k] = bool(
                    c >= 0
                    and got is not None
                    and GPU_NAMES[int(pool.class_type[c])] == got.gpu_type
                    and KIND_NAMES[int(pool.class_kind[c])] == got.kind
                    and pool.class_profile[c] == got.mig_profile
                )
        return out

    def _metrics(self) -> SimulationMetrics:
        rows = [self.jobs[j] for j in self._order]
        n = len(rows)
        reserved = np.full(n, np.nan)
        peak = np.full(n, np.nan)
        smallest = np.zeros(n, bool)
        done: list[int] = []
        for i, job in enumerate(rows):
            if job.option is not None and np.isfinite(job.end_s):
                reserved[i] = job.option.reserved_gib
                peak[i] = job.true_peak_gib(job.option.gpu_type)
                done.append(i)
        if self.smallest_fit and done:
            smallest[done] = self._smallest_fit([rows[i] for i in done])
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
        metrics = compute_metrics(
            jobs,
            attempts,
            pool_gpus=self.pool.n_gpus,
            placement_seconds=self.core.counters.placement_seconds,
            n_placements=self._placed,
        )
        # Not computed is not 0%: the rate is NaN (null in JSON, "-" in tables).
        return metrics if self.smallest_fit else replace(metrics, smallest_fit_rate=math.nan)


def simulate(
    pool: Pool,
    policies: Sequence[str],
    workload: Workload,
    *,
    seed: int = 0,
    predictions: PredictionTable | None = None,
    residuals: ResidualModel | None = None,
    smallest_fit: bool = True,
    feedback: bool = False,
    tick_interval_s: float = 0.0,
    predict: TableFn | None = None,
) -> list[SimulationResult]:
    """Run several policies on the same workload and the same truth draws.

    With ``feedback`` each policy's run starts from an empty history and learns as it goes.
    """
    from scheduler.policies.registry import get_policy

    table = predictions if predictions is not None else predict_workload(workload)
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
            feedback=feedback,
            tick_interval_s=tick_interval_s,
            predict=predict,
        )
        out.append(sim.run())
    return out


#: Jobs per vectorised smallest-fit probe (bounds the (jobs, classes) arrays' memory).
_SMALLEST_FIT_CHUNK = 20_000


def _truth_probe(job: _Job) -> PlacementRequest:
    """The job as if the predictor knew its true peak and runtime (smallest-fit's question)."""
    assert job.base is not None
    truth = job.base.vram_gib * job.vram_factor
    runtime = job.base.runtime_s * job.runtime_factor
    return probe_request(job.request, truth, truth, runtime, runtime)


def _requests(
    workload: Workload, predictions: PredictionTable, pool: Pool
) -> list[PlacementRequest]:
    """Every job's request in one vectorised pass, with the predictor's host memory estimates
    (the live client does the same at submit). Host floors and gradient traffic are computed
    once per distinct spec (they do not read the id)."""
    specs = workload.specs
    first, inverse = distinct_rows(workload)
    distinct = [specs[i] for i in first.tolist()]
    syncs = gradient_syncs(distinct)
    return requests_from_table(
        specs,
        predictions,
        submit_time_s=workload.arrival_s.tolist(),
        requested_gpu=lambda upper: requested_types(
            upper, [s.n_gpus for s in specs], workload.requested_gpu, pool
        ),
        host_memory_floor_gib=np.asarray(host_floor_gib(distinct), np.float64)[inverse],
        sync=[syncs[k] for k in inverse.tolist()],
    )


def _fingerprints(workload: Workload) -> tuple[str, ...]:
    """:func:`~predictor.history.fingerprint` of every spec, computed once per distinct spec
    (:func:`~scheduler.sim.workload.distinct_rows`: a recurring job's submissions differ only
    in ``id``, which the fingerprint leaves out)."""
    first, inverse = distinct_rows(workload)
    fps = [fingerprint(workload.specs[i]) for i in first.tolist()]
    return tuple(fps[k] for k in inverse.tolist())


def _analytical(specs: Sequence[JobSpec]) -> PredictionTable:
    from predictor.analytical import predict_table

    return predict_table(list(specs))
