"""Accuracy of the traced tier on measured peak-VRAM rows: over all, and over those it covers.

The traced tier's point has nothing fitted, so it is scored directly (no measured value ever
reaches it). Rows it does not cover (excluded frameworks, families it cannot build, failed
traces) get the analytical answer in the all-rows report.

Its upper bound is reported twice: the fixed margin the tier ships with (×1.10 + 0.5 GiB), and
a split-conformal bound calibrated **within grouped cross-validation by source**: each
source's rows get the 95% conformal quantile of ``log(measured / point)`` over the other
sources' calibration rows (per task family and base, pooled below 30 scores, as
:class:`~predictor.conformal.ConformalUpper` does), so no row's bound saw its own source.
It is reported a third way too, with the same folds and bases but each source one unit of
calibration mass (:func:`~predictor.conformal.source_weighted_quantile`): the unit grouped CV
treats as exchangeable. And a fourth: source-weighted, calibrated on every row that passes the
data checks, low-confidence rows included, so the calibration rows are drawn like the rows the
bound is scored on (every row is scored). All are always reported; the shipped bound is the
first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..conformal import (
    DEFAULT_COVERAGE,
    TRACED_SUFFIX,
    ConformalUpper,
    base_family,
    source_weighted_quantile,
)
from ..evaluation import EvalReport, PredictedValues, evaluate, predicted_values, source_group
from ..measurements import LOW_CONFIDENCE, Measurement, calibration_exclusion
from ._api import TracedPredictor, trace_specs
from .cache import TraceCache

__all__ = ["conformal_by_source", "traced_reports", "warm_measured"]


def warm_measured(
    measurements: Sequence[Measurement],
    *,
    workers: int = 1,
    cache: TraceCache | None = None,
    analytical: Any = None,
) -> TracedPredictor:
    """Trace the jobs of the rows that measured peak VRAM (what a trace can change) and return
    a cache-reading :class:`TracedPredictor` for them: the base of the learned tier.

    ``analytical`` answers what the traces do not (runtimes, untraceable jobs); pass the
    out-of-source analytical predictor when cross-validating, so its time figures stay out of
    source.
    """
    cache = cache or TraceCache()
    vram = [m.spec for m in measurements if m.peak_vram_gib is not None]
    trace_specs(vram, workers=workers, cache=cache)
    return TracedPredictor(cache=cache, analytical=analytical)


def conformal_by_source(
    measurements: Sequence[Measurement],
    pv: PredictedValues,
    traced: Sequence[bool],
    coverage: float = DEFAULT_COVERAGE,
    weighting: str = "row",
    low_confidence: bool = False,
) -> PredictedValues:
    """``pv`` with its peak-VRAM upper bounds replaced by leave-one-source-out conformal ones.

    ``weighting="row"``: :class:`ConformalUpper` on the other sources' rows (per family and
    base); ``"source"``: per base, each other source one unit of mass. ``low_confidence``:
    low-confidence rows calibrate too (rows failing a data check or a documented quirk never
    do)."""
    metric = "peak_vram_gib"
    point = pv.point[metric]
    measured = np.array([m.peak_vram_gib or np.nan for m in measurements], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.log(measured / point)
    fams = [base_family(m.spec.task.value, t) for m, t in zip(measurements, traced, strict=True)]
    sources = np.array([source_group(m) for m in measurements])
    calib = np.array([_calibrates(calibration_exclusion(m), low_confidence) for m in measurements])
    ok = np.isfinite(scores) & calib
    upper = np.full(len(measurements), np.nan)
    for src in sorted(set(sources.tolist())):
        held = sources == src
        train = ok & ~held
        if not train.any():
            continue
        idx = np.flatnonzero(held)
        if weighting == "source":
            upper[idx] = point[idx] * _source_margins(scores, fams, sources, train, idx, coverage)
            continue
        cu = ConformalUpper(coverage=coverage).fit(
            scores[train], [f for f, t in zip(fams, train, strict=True) if t]
        )
        upper[idx] = cu.upper(point[idx], [fams[i] for i in idx])
    out_upper = dict(pv.upper)
    out_upper[metric] = np.where(np.isfinite(point), upper, np.nan)
    return PredictedValues(dict(pv.point), out_upper, pv.gpu_column, pv.unexpressed)


def _calibrates(exclusion: str | None, low_confidence: bool) -> bool:
    return exclusion is None or (low_confidence and exclusion == LOW_CONFIDENCE)


def _source_margins(
    scores: np.ndarray,
    fams: Sequence[str],
    sources: np.ndarray,
    train: np.ndarray,
    idx: np.ndarray,
    coverage: float,
) -> np.ndarray:
    """exp(q) per held-out row: the source-weighted quantile of its base's training scores
    (every base's when its own has none)."""
    traced = np.array([f.endswith(TRACED_SUFFIX) for f in fams])
    out = np.ones(idx.size)
    for j, i in enumerate(idx):
        same = train & (traced == traced[i])
        use = same if same.any() else train
        q = source_weighted_quantile(scores[use], sources[use], coverage)
        out[j] = float(np.exp(max(0.0, q)))
    return out


def traced_reports(
    measurements: Sequence[Measurement],
    *,
    workers: int = 1,
    cache: TraceCache | None = None,
) -> list[EvalReport]:
    """``[traced (all rows), traced (covered rows)]`` with the tier's fixed-margin bound, then
    the same two with the grouped-CV conformal bound, then with its source-weighted variant;
    traces what the cache lacks first."""
    cache = cache or TraceCache()
    measurements = [m for m in measurements if m.peak_vram_gib is not None]
    outs = trace_specs([m.spec for m in measurements], workers=workers, cache=cache)
    pred = TracedPredictor(cache=cache)
    pv = predicted_values(measurements, pred)
    traced = [o.traced for o in outs]
    cpv = conformal_by_source(measurements, pv, traced)
    everything = evaluate(measurements, pv, tier="traced")
    keep = [i for i, t in enumerate(traced) if t]
    covered = [measurements[i] for i in keep]
    sub = evaluate(covered, _subset(pv, keep), tier="traced (covered rows)")
    conf = evaluate(measurements, cpv, tier="traced+conformal (grouped CV by source)")
    conf_sub = evaluate(
        covered, _subset(cpv, keep), tier="traced+conformal (covered rows, grouped CV)"
    )
    spv = conformal_by_source(measurements, pv, traced, weighting="source")
    src = evaluate(measurements, spv, tier="traced+conformal source-weighted (grouped CV)")
    src_sub = evaluate(
        covered,
        _subset(spv, keep),
        tier="traced+conformal source-weighted (covered rows, grouped CV)",
    )
    apv = conformal_by_source(measurements, pv, traced, weighting="source", low_confidence=True)
    low = evaluate(
        measurements, apv, tier="traced+conformal source-weighted, low-confidence calibrate"
    )
    low_sub = evaluate(
        covered,
        _subset(apv, keep),
        tier="traced+conformal source-weighted, low-confidence calibrate (covered rows)",
    )
    from collections import Counter

    why = Counter(o.status for o in outs if not o.traced)
    note = (
        f"traced tier covers {len(covered)} of {len(measurements)} measured jobs; the rest "
        f"answered analytically ({', '.join(f'{k}: {v}' for k, v in sorted(why.items()))})"
    )
    for r in (everything, sub, conf, conf_sub, src, src_sub, low, low_sub):
        r.notes.append(note)
    for r in (conf, conf_sub):
        r.notes.append(
            "upper bound: 95% split-conformal on log(measured/point), calibrated on the other "
            "sources' calibration rows (grouped CV by source)"
        )
    for r in (src, src_sub):
        r.notes.append(
            "upper bound: as traced+conformal, per base, each other source one unit of "
            "calibration mass (not the shipped bound; reported beside it)"
        )
    for r in (low, low_sub):
        r.notes.append(
            "upper bound: as the source-weighted one, with the other sources' low-confidence "
            "rows calibrating too (not the shipped bound; reported beside it)"
        )
    return [everything, sub, conf, conf_sub, src, src_sub, low, low_sub]


def _subset(pv: PredictedValues, keep: list[int]) -> PredictedValues:
    cols = pv.gpu_column
    return PredictedValues(
        {k: v[keep] for k, v in pv.point.items()},
        {k: v[keep] for k, v in pv.upper.items()},
        tuple(cols[i] for i in keep) if cols else cols,
        pv.unexpressed,
    )
