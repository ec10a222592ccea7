"""Nested grouped cross-validation of the learned tier, by source.

Every figure here is "a setup never seen": folds are whole sources, the shrinkage of an outer
fold is chosen by inner grouped CV of its training sources, and conformal bounds are calibrated
on inner out-of-fold scores only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._learned_features import (
    FEATURE_NAMES,
    LEARNED_METRICS,
    _is_traced,
    _monotone,
    feature_matrix,
)
from ._learned_regressor import DEFAULT_PARAMS, ResidualRegressor
from .analytical import AnalyticalPredictor
from .conformal import (
    DEFAULT_COVERAGE,
    MIN_FAMILY_SCORES,
    RUNTIME_COVERAGE,
    ConformalUpper,
    base_family,
)
from .evaluation import (
    EvalReport,
    PredictedValues,
    TablePredictor,
    evaluate,
    predicted_values,
    source_group,
    summarise,
)
from .gpus import GPU_NAMES
from .measurements import Measurement, calibration_exclusion, is_quirk
from .prediction import PredictionTable

__all__ = ["SHRINK_GRID", "CVResult", "cross_validate", "metric_coverage"]

#: Shrinkage factors tried for each metric's correction (0 = analytical, 1 = full correction).
SHRINK_GRID: tuple[float, ...] = tuple(float(x) for x in np.linspace(0.0, 1.0, 11))


# ------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class _MetricData:
    idx: np.ndarray  # measurement indices with this metric measured and predicted
    X: np.ndarray
    y: np.ndarray  # log(measured / analytical)
    base: np.ndarray  # analytical point (kind-adjusted)
    groups: np.ndarray  # source group per row
    families: np.ndarray  # task family per row
    train: np.ndarray  # bool: may train a correction (documented quirks may not)
    calibrate: np.ndarray  # bool: may calibrate a bound (not low confidence, not a quirk)


def _metric_data(
    measurements: Sequence[Measurement],
    table: PredictionTable,
    pv: PredictedValues,
    metric: str,
) -> _MetricData:
    measured = np.array(
        [np.nan if (v := m.value(metric)) is None else v for m in measurements], dtype=float
    )
    base = pv.point[metric]
    ok = np.isfinite(measured) & np.isfinite(base) & (base > 0)
    idx = np.flatnonzero(ok)
    cols = np.array([table.column(pv.gpu_column[i] or "A100-80GB") for i in idx], dtype=int)
    specs = [m.spec for m in measurements]
    rows = [measurements[int(i)] for i in idx]
    X = (
        feature_matrix(specs, table, idx, cols, metric, [m.measurement for m in rows])
        if idx.size
        else np.empty((0, len(FEATURE_NAMES)))
    )
    return _MetricData(
        idx=idx,
        X=X,
        y=np.log(measured[idx] / base[idx]),
        base=base[idx],
        groups=np.array([source_group(m) for m in rows]),
        families=np.array(
            [
                base_family(m.spec.task.value, _is_traced(table.method[int(i)]))
                for m, i in zip(rows, idx, strict=True)
            ]
        ),
        train=np.array([not is_quirk(m) for m in rows], dtype=bool),
        calibrate=np.array([calibration_exclusion(m) is None for m in rows], dtype=bool),
    )


def _ape(y: np.ndarray, corr: np.ndarray) -> float:
    """MAPE in measured space of a log-correction: |exp(corr − y) − 1| averaged."""
    return float(np.mean(np.abs(np.expm1(corr - y)))) if y.size else float("nan")


def _oof(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    n_splits: int,
    params: Mapping[str, Any],
    monotone: Sequence[int] | None,
    train: np.ndarray | None = None,
) -> np.ndarray:
    """Out-of-fold log-ratio predictions with GroupKFold; 0 where a fold cannot fit."""
    from sklearn.model_selection import GroupKFold

    out = np.zeros(len(y))
    k = min(n_splits, len(set(groups.tolist())))
    if k < 2:
        return out
    for tr, te in GroupKFold(n_splits=k).split(X, y, groups):
        if train is not None:
            tr = tr[train[tr]]
        if tr.size < 4:
            continue
        model = ResidualRegressor(params=params, monotone=monotone).fit(X[tr], y[tr])
        out[te] = model.predict(X[te])
    return out


def _choose_shrink(y: np.ndarray, oof: np.ndarray) -> float:
    """The shrinkage of an out-of-fold correction with the lowest MAPE (0 = analytical)."""
    return min(SHRINK_GRID, key=lambda lam: (_ape(y, lam * oof), lam))


@dataclass(frozen=True)
class _Fold:
    test: np.ndarray
    correction: np.ndarray  # λ × model prediction on the test rows
    shrink: float
    scores: np.ndarray  # inner out-of-fold residuals of the training rows (calibratable)
    raw_scores: np.ndarray  # the analytical log-ratios of the same rows
    families: np.ndarray


def _nested(d: _MetricData, n_splits: int, params: Mapping[str, Any], metric: str) -> list[_Fold]:
    """Outer GroupKFold by source; within each, inner grouped CV picks the shrinkage.

    Neither the correction, its shrinkage nor the calibration scores of a fold ever see the
    fold's own sources.
    """
    from sklearn.model_selection import GroupKFold

    mono = _monotone(metric)
    folds: list[_Fold] = []
    n_groups = len(set(d.groups.tolist()))
    for tr, te in GroupKFold(n_splits=min(n_splits, n_groups)).split(d.X, d.y, d.groups):
        trn = tr[d.train[tr]]
        inner = _oof(d.X[trn], d.y[trn], d.groups[trn], max(2, n_splits - 1), params, mono)
        lam = _choose_shrink(d.y[trn], inner)
        corr = np.zeros(te.size)
        if lam > 0 and trn.size >= 4:
            model = ResidualRegressor(params=params, monotone=mono).fit(d.X[trn], d.y[trn])
            corr = lam * model.predict(d.X[te])
        cal = d.calibrate[trn]
        folds.append(
            _Fold(
                test=te,
                correction=corr,
                shrink=lam,
                scores=(d.y[trn] - lam * inner)[cal],
                raw_scores=d.y[trn][cal],
                families=d.families[trn][cal],
            )
        )
    return folds


def _nested_score(
    d: _MetricData, n_splits: int, params: Mapping[str, Any], metric: str
) -> tuple[list[_Fold], np.ndarray, dict[str, float]]:
    """The nested folds, their out-of-fold corrections and the MAPE of both tiers on them."""
    folds = _nested(d, n_splits, params, metric)
    corr = np.zeros(d.y.size)
    for f in folds:
        corr[f.test] = f.correction
    measured = d.base * np.exp(d.y)
    a = summarise(measured, d.base, d.base)
    lrn = summarise(measured, d.base * np.exp(corr), d.base * np.exp(corr))
    comparison = {
        "analytical_mape": a.mape,
        "learned_mape": lrn.mape,
        "analytical_median_ape": a.median_ape,
        "learned_median_ape": lrn.median_ape,
    }
    return folds, corr, comparison


def metric_coverage(metric: str, vram_coverage: float, runtime_coverage: float) -> float:
    return vram_coverage if metric == "peak_vram_gib" else runtime_coverage


def _conformal(metric: str, coverage: float) -> ConformalUpper:
    # Task families separate memory errors (inference ≪ training), but not time errors, which
    # follow the source's stack; grouped CV finds pooled time bounds narrower at equal coverage.
    min_scores = MIN_FAMILY_SCORES if metric == "peak_vram_gib" else _POOLED
    return ConformalUpper(coverage, min_scores=min_scores)


_POOLED = 1_000_000_000


# ------------------------------------------------------------------------------ grouped CV
@dataclass(frozen=True)
class CVResult:
    report: EvalReport
    analytical: EvalReport
    comparison: dict[str, dict[str, float]]
    fallback: dict[str, str]


def cross_validate(
    measurements: Sequence[Measurement],
    n_splits: int = 5,
    coverage: float = DEFAULT_COVERAGE,
    params: Mapping[str, Any] | None = None,
    base: TablePredictor | None = None,
    runtime_coverage: float = RUNTIME_COVERAGE,
) -> CVResult:
    """Grouped CV by source of the whole learned tier, upper bounds included.

    For each outer fold the corrections are fitted on the other sources, their shrinkage is
    chosen by inner grouped CV of those sources, and the conformal bound is calibrated on the
    inner out-of-fold scores of those sources only (confident, quirk-free rows), so coverage is
    measured on data that neither the model nor its calibration saw. Every row is scored,
    low-confidence and quirk rows included.
    """
    params = dict(params or DEFAULT_PARAMS)
    base = base or AnalyticalPredictor()
    specs = [m.spec for m in measurements]
    table = base.predict_table(specs, GPU_NAMES)
    pv = predicted_values(measurements, lambda s, g: table)
    point = {k: v.copy() for k, v in pv.point.items()}
    upper = {k: v.copy() for k, v in pv.upper.items()}
    comparison: dict[str, dict[str, float]] = {}
    fallback: dict[str, str] = {}
    for metric in LEARNED_METRICS:
        d = _metric_data(measurements, table, pv, metric)
        cov = metric_coverage(metric, coverage, runtime_coverage)
        n_groups = len(set(d.groups.tolist()))
        if d.y.size < 8 or n_groups < 3:
            fallback[metric] = f"{d.y.size} rows from {n_groups} source(s): analytical only"
            continue
        folds, corr, comparison[metric] = _nested_score(d, n_splits, params, metric)
        q = np.zeros(d.y.size)
        analytical_q = np.zeros(d.y.size)
        for f in folds:
            fams_te = d.families[f.test].tolist()
            conf = _conformal(metric, cov).fit(f.scores, f.families.tolist())
            q[f.test] = conf.log_margin(fams_te)
            analytical_q[f.test] = (
                _conformal(metric, cov).fit(f.raw_scores, f.families.tolist()).log_margin(fams_te)
            )
        lrn_mape, a_mape = comparison[metric]["learned_mape"], comparison[metric]["analytical_mape"]
        if lrn_mape < a_mape:
            point[metric][d.idx] = d.base * np.exp(corr)
            upper[metric][d.idx] = d.base * np.exp(corr + q)
        else:
            fallback[metric] = (
                f"nested grouped-CV MAPE {lrn_mape:.1%} ≥ analytical {a_mape:.1%}: falls back"
            )
            point[metric][d.idx] = d.base
            upper[metric][d.idx] = d.base * np.exp(analytical_q)
    _runtime_from_parts(measurements, table, pv, point, upper)
    learned_pv = PredictedValues(point, upper, pv.gpu_column, pv.unexpressed)
    report = evaluate(measurements, learned_pv, tier="learned")
    report.notes.append(
        "nested grouped CV by source: shrinkage and conformal bounds from inner CV of the "
        f"training sources; bounds target {coverage:.0%} (VRAM) / {runtime_coverage:.0%} (time)"
    )
    report.notes.extend(f"{m}: {why}" for m, why in fallback.items())
    return CVResult(
        report=report,
        analytical=evaluate(measurements, pv, tier="analytical"),
        comparison=comparison,
        fallback=fallback,
    )


def _runtime_from_parts(
    measurements: Sequence[Measurement],
    table: PredictionTable,
    pv: PredictedValues,
    point: dict[str, np.ndarray],
    upper: dict[str, np.ndarray],
) -> None:
    """The whole-job runtime follows the step/TTFT/TPOT corrections and their bounds.

    A training job is ``steps × step``; an inference job's runtime scales with its prefill
    and decode shares, as in :meth:`LearnedPredictor.predict_table`.
    """
    base = pv.point["runtime_s"]
    for i, m in enumerate(measurements):
        if not np.isfinite(base[i]) or pv.gpu_column[i] is None:
            continue
        j = table.column(pv.gpu_column[i] or "A100-80GB")
        if m.spec.task.is_training:
            b = float(table.step_time_s[i, j])
            p, u = point["step_time_s"][i], upper["step_time_s"][i]
            if not (np.isfinite(p) and np.isfinite(u) and b > 0):
                p, u = b, b * (pv.upper["runtime_s"][i] / base[i])
            point["runtime_s"][i] = base[i] * p / b
            upper["runtime_s"][i] = base[i] * u / b
            continue
        ttft, tpot = float(table.ttft_s[i, j]), float(table.tpot_s[i, j])
        if not (ttft > 0 and tpot > 0):
            continue
        w = ttft / (ttft + tpot * float(m.spec.output_len or 0))

        def ratio(arr: np.ndarray, b: float) -> float:
            return float(arr / b) if np.isfinite(arr) else float("nan")

        rp = [ratio(point["ttft_s"][i], ttft), ratio(point["tpot_s"][i], tpot)]
        ru = [ratio(upper["ttft_s"][i], ttft), ratio(upper["tpot_s"][i], tpot)]
        if all(np.isfinite(rp)) and all(np.isfinite(ru)):
            point["runtime_s"][i] = base[i] * (w * rp[0] + (1 - w) * rp[1])
            upper["runtime_s"][i] = point["runtime_s"][i] * max(ru[0] / rp[0], ru[1] / rp[1])
