"""Is a retrained learned tier no worse than the one it would replace? Grouped CV says.

The two are compared as the training procedure that makes them, on the same data and the
same folds: nested grouped CV by source (:mod:`predictor._learned_cv`) over every row,
once with the new rows allowed to train (the candidate) and once with them held out of every
training fold (the incumbent: what it was trained on, the published rows plus the history it
already had). Both are scored on every row, new ones included, each time by a model that never
saw that row's source. The figure compared is the correction's MAPE, not the better of it and
the analytical tier's: the analytical fallback is the same for both, so it must not make a
worse correction acceptable (the analytical MAPE is reported beside them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ._learned_cv import _ape, _metric_data, _MetricData, _nested
from ._learned_features import LEARNED_METRICS
from ._learned_regressor import DEFAULT_PARAMS
from .analytical import AnalyticalPredictor
from .evaluation import TablePredictor, predicted_values
from .gpus import GPU_NAMES
from .measurements import Measurement

__all__ = ["TOLERANCE", "compare_retrained", "no_worse"]

#: Slack in MAPE (absolute) under which the candidate still counts as no worse: float noise.
TOLERANCE = 1e-9


def _procedure_mape(d: _MetricData, n_splits: int, params: Mapping[str, Any], metric: str) -> float:
    corr = np.zeros(d.y.size)
    for f in _nested(d, n_splits, params, metric):
        corr[f.test] = f.correction
    return _ape(d.y, corr)


def compare_retrained(
    measurements: Sequence[Measurement],
    new: Sequence[bool],
    *,
    base: TablePredictor | None = None,
    n_splits: int = 5,
    params: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Per metric that the new rows measure: ``n`` rows, ``n_new``, ``analytical_mape``,
    ``incumbent_mape`` and ``candidate_mape`` (module doc). Metrics without a new row, or
    with too few rows or sources for grouped CV, are left out: nothing to say there."""
    is_new = np.asarray(new, dtype=bool)
    if is_new.shape != (len(measurements),):
        raise ValueError(f"`new` needs one flag per measurement; got {is_new.shape}")
    params = dict(params or DEFAULT_PARAMS)
    base = base or AnalyticalPredictor()
    table = base.predict_table([m.spec for m in measurements], GPU_NAMES)
    pv = predicted_values(measurements, lambda s, g: table)
    out: dict[str, dict[str, float]] = {}
    for metric in LEARNED_METRICS:
        d = _metric_data(measurements, table, pv, metric)
        new_rows = is_new[d.idx]
        if not new_rows.any() or d.y.size < 8 or len(set(d.groups.tolist())) < 3:
            continue
        incumbent = replace(d, train=d.train & ~new_rows)
        out[metric] = {
            "n": float(d.y.size),
            "n_new": float(new_rows.sum()),
            "analytical_mape": _ape(d.y, np.zeros(d.y.size)),
            "incumbent_mape": _procedure_mape(incumbent, n_splits, params, metric),
            "candidate_mape": _procedure_mape(d, n_splits, params, metric),
        }
    return out


def no_worse(cv: Mapping[str, Mapping[str, float]]) -> tuple[bool, str]:
    """The decision on :func:`compare_retrained`'s figures, and why."""
    if not cv:
        return False, "no metric the new rows measure has enough rows and sources to compare"
    worse = [
        f"{m} {v['candidate_mape']:.2%} > {v['incumbent_mape']:.2%}"
        for m, v in cv.items()
        if v["candidate_mape"] > v["incumbent_mape"] + TOLERANCE
    ]
    if worse:
        return False, "grouped-CV MAPE worse with the new rows: " + ", ".join(worse)
    figures = ", ".join(
        f"{m} {v['candidate_mape']:.2%} <= {v['incumbent_mape']:.2%}" for m, v in cv.items()
    )
    return True, "grouped-CV MAPE no worse with the new rows: " + figures
