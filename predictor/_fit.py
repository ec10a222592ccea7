"""Fit the runtime model's efficiency table on measured rows, and score it out of source.

The fit is a robust least-squares on ``log(predicted / measured)`` of every time metric (step
time, TTFT, TPOT, runtime), with a ridge pulling each fitted parameter towards its quoted prior
in log space: a parameter no training row informs (an architecture or engine absent from the
data) keeps its prior instead of drifting. Rows that fail a data check or carry a documented
quirk never enter a fit.

:func:`cross_validate_efficiencies` is leave-one-source-out: each source's rows are predicted
by a table fitted on every *other* source, so the errors it reports are out of source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from ._jobarrays import JobArrays, job_arrays
from ._memory import GIB, MemoryModel, memory_breakdown_gib
from ._runtime import RuntimeModel, runtime_figures
from .analytical import AnalyticalPredictor
from .efficiency import PARAMETERS, Efficiencies, prior_efficiencies
from .evaluation import EvalReport, PredictedValues, evaluate, predicted_values, source_group
from .gpus import GPU_NAMES, GpuType, get_gpu
from .measurements import Measurement, is_quirk
from .prediction import PredictionTable
from .spec import JobSpec

__all__ = [
    "TIME_METRICS",
    "OutOfSourceAnalytical",
    "cross_validate_efficiencies",
    "evaluate_out_of_source",
    "fit_efficiencies",
    "out_of_source_values",
]

TIME_METRICS: tuple[str, ...] = ("step_time_s", "ttft_s", "tpot_s", "runtime_s")
#: Prior width in log space: a fitted value 2× from its prior costs as much as one row 2× off.
PRIOR_SIGMA = 0.7
#: Robust-loss scale in log space (soft L1): rows ≳ 15% off count linearly, not squared.
LOSS_SCALE = 0.15
#: Weight of the prior residuals against the rows. Chosen among 1, 4 and 12 by the
#: leave-one-source-out MAPE of benchmarks/bench_eval.py (a mild selection on that CV).
PRIOR_WEIGHT = 4.0
#: Rows weigh counts**-w per source (0 = every row equal).
SOURCE_WEIGHTING = 0.0


@dataclass(frozen=True)
class _Rows:
    """The time-metric rows of a set of measurements, as arrays the model evaluates fast."""

    j: JobArrays
    weights_bytes: np.ndarray
    gpu_col: np.ndarray  # index into GPU_NAMES per job
    gpus: list[GpuType]  # each job's GPU
    job: np.ndarray  # row → job index
    metric: np.ndarray  # row → index into TIME_METRICS
    measured: np.ndarray
    weight: np.ndarray


def _rows(measurements: Sequence[Measurement]) -> _Rows | None:
    usable = [m for m in measurements if m.gpu is not None and not is_quirk(m)]
    job, metric, measured, src = [], [], [], []
    for i, m in enumerate(usable):
        for k, name in enumerate(TIME_METRICS):
            v = m.value(name)
            if v is not None and v > 0:
                job.append(i)
                metric.append(k)
                measured.append(v)
                src.append(m.source.split(" | ", 1)[0])
    if not job:
        return None
    j = job_arrays([m.spec for m in usable])
    bd = memory_breakdown_gib(j, (GPU_NAMES[0],), MemoryModel())
    # Each source counts with the square root of its size, so one large table cannot set
    # every constant alone and one odd row cannot either.
    _, inv, counts = np.unique(np.array(src), return_inverse=True, return_counts=True)
    return _Rows(
        j=j,
        weights_bytes=bd["weights"][:, 0] * GIB,
        gpu_col=np.array([GPU_NAMES.index(m.gpu or "") for m in usable]),
        gpus=[get_gpu(m.gpu or "") for m in usable],
        job=np.array(job),
        metric=np.array(metric),
        measured=np.array(measured),
        weight=np.ones(len(job))
        if SOURCE_WEIGHTING == 0
        else (np.mean(counts[inv]) / counts[inv]) ** SOURCE_WEIGHTING,
    )


def _predict(rows: _Rows, eff: Efficiencies) -> np.ndarray:
    figs = runtime_figures(rows.j, rows.gpus, rows.weights_bytes, RuntimeModel(eff), per_job=True)
    stacked = np.stack([figs[m][:, 0] for m in TIME_METRICS])  # (metric, job)
    return stacked[rows.metric, rows.job]


def fit_efficiencies(
    measurements: Sequence[Measurement],
    start: Efficiencies | None = None,
    max_nfev: int = 60,
) -> Efficiencies:
    """Fit every ``fitted`` parameter on the time rows of ``measurements``; see module doc."""
    start = start or prior_efficiencies()
    rows = _rows(measurements)
    if rows is None:
        return start
    free = [p for p in PARAMETERS if p.fitted]
    prior = np.log([p.prior for p in free])
    lo, hi = np.log([p.lo for p in free]), np.log([p.hi for p in free])
    x0 = np.clip(np.log([start[p.name] for p in free]), lo + 1e-9, hi - 1e-9)
    names = [p.name for p in free]
    # A tied parameter's prior is on its log-ratio to another: penalise the two offsets' gap.
    tie = np.array([names.index(p.tie) if p.tie else k for k, p in enumerate(free)])
    tied = np.array([p.tie is not None for p in free], dtype=float)

    def residuals(x: np.ndarray) -> np.ndarray:
        eff = start.with_values(dict(zip(names, np.exp(x), strict=True)))
        with np.errstate(all="ignore"):
            pred = _predict(rows, eff)
        r = np.log(np.maximum(pred, 1e-12) / rows.measured) * rows.weight
        r = np.where(np.isfinite(r), r, 10.0)
        return np.concatenate(
            [r, PRIOR_WEIGHT * (x - prior - (x - prior)[tie] * tied) / PRIOR_SIGMA]
        )

    sol = least_squares(
        residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE, max_nfev=max_nfev
    )
    fitted = dict(zip(names, (float(v) for v in np.exp(sol.x)), strict=True))
    return start.with_values(
        fitted, fitted_on=f"fit on {len(set(rows.job.tolist()))} jobs", n_rows=int(rows.job.size)
    )


def cross_validate_efficiencies(
    measurements: Sequence[Measurement], groups: Sequence[str], max_nfev: int = 60
) -> dict[str, Efficiencies]:
    """One table per source group, each fitted on every *other* group's rows."""
    groups = list(groups)
    out: dict[str, Efficiencies] = {}
    timed = {
        g
        for g, m in zip(groups, measurements, strict=True)
        if any(m.value(k) is not None for k in TIME_METRICS)
    }
    for held in sorted(timed):
        train = [m for g, m in zip(groups, measurements, strict=True) if g != held]
        out[held] = fit_efficiencies(train, max_nfev=max_nfev)
    return out


def out_of_source_values(
    measurements: Sequence[Measurement], max_nfev: int = 60
) -> tuple[PredictedValues, dict[str, Efficiencies]]:
    """Analytical predictions of every row with efficiencies fitted without the row's source.

    VRAM rows keep the default analytical prediction (the memory model is not fitted here).
    Returns the aligned values and the table each source was predicted with.
    """
    groups = [source_group(m) for m in measurements]
    tables = cross_validate_efficiencies(measurements, groups, max_nfev=max_nfev)
    base = predicted_values(measurements, AnalyticalPredictor())
    point = {k: v.copy() for k, v in base.point.items()}
    upper = {k: v.copy() for k, v in base.upper.items()}
    for held, eff in tables.items():
        idx = [i for i, g in enumerate(groups) if g == held]
        pv = predicted_values(
            [measurements[i] for i in idx], AnalyticalPredictor(runtime_model=RuntimeModel(eff))
        )
        for k in TIME_METRICS:
            point[k][idx] = pv.point[k]
            upper[k][idx] = pv.upper[k]
    return PredictedValues(point, upper, base.gpu_column, base.unexpressed), tables


def evaluate_out_of_source(
    measurements: Sequence[Measurement], oos: OutOfSourceAnalytical | None = None
) -> EvalReport:
    """The analytical tier's accuracy with leave-one-source-out efficiency fits."""
    oos = oos or OutOfSourceAnalytical.from_measurements(measurements)
    report = evaluate(measurements, oos, tier="analytical")
    report.notes.append(
        "time metrics: efficiency table fitted leave-one-source-out (each source predicted by "
        "a table that never saw it); VRAM: the analytical memory model (not fitted)"
    )
    return report


@dataclass(frozen=True)
class OutOfSourceAnalytical:
    """A table predictor for CV of tiers built on the analytical one (the learned tier).

    A spec that is one of the measured rows' own specs (the same object, or the same non-null
    ``id``) gets the time figures of the table fitted without that row's source; any other
    spec gets the default analytical prediction.
    """

    group_of_object: dict[int, str]
    group_of_id: dict[str, str]
    tables: dict[str, Efficiencies]
    _keep: tuple[JobSpec, ...] = ()  # keeps the keyed objects alive, so their ids stay theirs

    @classmethod
    def from_measurements(
        cls, measurements: Sequence[Measurement], tables: dict[str, Efficiencies] | None = None
    ) -> OutOfSourceAnalytical:
        groups = [source_group(m) for m in measurements]
        if tables is None:
            tables = cross_validate_efficiencies(measurements, groups)
        ids: dict[str, str | None] = {}
        for m, g in zip(measurements, groups, strict=True):
            if m.spec.id is not None:
                # An id two sources share is ambiguous: neither may use it.
                ids[m.spec.id] = g if ids.get(m.spec.id, g) == g else None
        return cls(
            {id(m.spec): g for m, g in zip(measurements, groups, strict=True)},
            {k: v for k, v in ids.items() if v is not None},
            tables,
            tuple(m.spec for m in measurements),
        )

    def _group(self, spec: JobSpec) -> str | None:
        g = self.group_of_object.get(id(spec))
        if g is None and spec.id is not None:
            g = self.group_of_id.get(spec.id)
        return g

    @property
    def memory_model(self) -> MemoryModel:
        """The analytical memory model (memory is not fitted, so it is the same in every fold)."""
        return AnalyticalPredictor().memory_model

    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable:
        table = AnalyticalPredictor().predict_table(specs, gpus)
        arrays = {k: getattr(table, k).copy() for k in _TABLE_TIME_FIELDS}
        by_group: dict[str, list[int]] = {}
        for i, s in enumerate(specs):
            g = self._group(s)
            if g is not None and g in self.tables:
                by_group.setdefault(g, []).append(i)
        for g, idx in by_group.items():
            sub = AnalyticalPredictor(runtime_model=RuntimeModel(self.tables[g])).predict_table(
                [specs[i] for i in idx], gpus
            )
            for k in _TABLE_TIME_FIELDS:
                arrays[k][idx] = getattr(sub, k)
        return replace(table, **arrays)


_TABLE_TIME_FIELDS = (
    "runtime_s",
    "runtime_upper_s",
    "step_time_s",
    "ttft_s",
    "tpot_s",
    "busy_frac",
)


def main(argv: list[str] | None = None) -> int:
    """Refit on every calibratable measured row and write the artifact."""
    import json
    import sys
    from pathlib import Path

    from .efficiency import artifact_path, default_efficiencies, efficiency_table_text
    from .measurements import load_measurements

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else artifact_path()
    eff = fit_efficiencies(load_measurements())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(eff.to_dict(), indent=1, sort_keys=True) + "\n")
    default_efficiencies.cache_clear()
    print(efficiency_table_text(eff))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
