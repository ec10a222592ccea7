"""Outcome metrics of one simulated run, as pure functions of per-job and per-attempt arrays.

An *attempt* is one placement of a job: it ends in a finish or an OOM kill. Costs and GPU-hours
are billed for the time each attempt really held its slot, OOM-killed ones included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["AttemptRecords", "JobRecords", "SimulationMetrics", "compute_metrics"]


@dataclass(frozen=True, slots=True)
class JobRecords:
    """One row per submitted job. Times in seconds; NaN where a job never started/finished."""

    arrival_s: np.ndarray
    first_start_s: np.ndarray
    end_s: np.ndarray
    oom_kills: np.ndarray  # int
    rejected: np.ndarray  # bool
    smallest_fit: np.ndarray  # bool: the final option is the cheapest fitting the TRUE peak
    reserved_gib: np.ndarray  # per GPU, final successful attempt
    true_peak_gib: np.ndarray  # per GPU, on the final successful attempt's GPU type


@dataclass(frozen=True, slots=True)
class AttemptRecords:
    """One row per attempt."""

    duration_s: np.ndarray
    cost_usd: np.ndarray
    gpu_hours: np.ndarray  # billed GPU-hours (a MIG slice or a shared share is a fraction)
    slot_gib: np.ndarray  # memory held: slot capacity x GPUs
    used_gib: np.ndarray  # true peak x GPUs (capped at the slot)


@dataclass(frozen=True, slots=True)
class SimulationMetrics:
    n_jobs: int
    n_finished: int
    n_rejected: int
    cost_usd: float
    gpu_hours: float
    reserved_over_actual_median: float
    reserved_over_actual_p95: float
    smallest_fit_rate: float
    oom_kills: int
    oom_kill_rate: float  # OOM kills per submitted job
    queue_delay_p50_s: float
    queue_delay_p95_s: float
    jct_p50_s: float
    jct_p95_s: float
    utilisation: float  # billed GPU-hours / (pool GPUs x makespan)
    stranded_vram_frac: float  # share of held slot memory the jobs never used
    makespan_s: float
    placements_per_s: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, float):
                out[k] = None if not np.isfinite(v) else round(v, 6)
        return out


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def compute_metrics(
    jobs: JobRecords,
    attempts: AttemptRecords,
    *,
    pool_gpus: int,
    placement_seconds: float,
    n_placements: int,
) -> SimulationMetrics:
    """Aggregate a run; see :class:`SimulationMetrics` for each field's meaning."""
    n = int(jobs.arrival_s.size)
    done = np.isfinite(jobs.end_s)
    delay = jobs.first_start_s - jobs.arrival_s
    jct = jobs.end_s - jobs.arrival_s
    ok = done & (jobs.true_peak_gib > 0)
    ratio = jobs.reserved_gib[ok] / jobs.true_peak_gib[ok]
    start = float(np.nanmin(jobs.arrival_s)) if n else 0.0
    end = float(np.nanmax(jobs.end_s)) if done.any() else start
    makespan = max(end - start, 0.0)
    gpu_hours = float(attempts.gpu_hours.sum())
    held = float((attempts.slot_gib * attempts.duration_s).sum())
    used = float((np.minimum(attempts.used_gib, attempts.slot_gib) * attempts.duration_s).sum())
    ooms = int(jobs.oom_kills.sum())
    return SimulationMetrics(
        n_jobs=n,
        n_finished=int(done.sum()),
        n_rejected=int(jobs.rejected.sum()),
        cost_usd=float(attempts.cost_usd.sum()),
        gpu_hours=gpu_hours,
        reserved_over_actual_median=_pct(ratio, 50),
        reserved_over_actual_p95=_pct(ratio, 95),
        smallest_fit_rate=float(jobs.smallest_fit[done].mean()) if done.any() else float("nan"),
        oom_kills=ooms,
        oom_kill_rate=ooms / n if n else 0.0,
        queue_delay_p50_s=_pct(delay, 50),
        queue_delay_p95_s=_pct(delay, 95),
        jct_p50_s=_pct(jct, 50),
        jct_p95_s=_pct(jct, 95),
        utilisation=gpu_hours / (pool_gpus * makespan / 3600.0) if makespan > 0 else 0.0,
        stranded_vram_frac=1.0 - used / held if held > 0 else 0.0,
        makespan_s=makespan,
        placements_per_s=n_placements / placement_seconds if placement_seconds > 0 else 0.0,
    )
