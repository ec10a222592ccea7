"""May a retrained learned tier replace the one it would replace? Two tests on grouped CV say.

The two are compared as the training procedure that makes them, on the same data and the same
folds: nested grouped CV by source (:mod:`predictor._learned_cv`) over every row, once with the
new rows allowed to train (the candidate) and once with them held out of every training fold
(the incumbent: what it was trained on, the published rows plus the history it already had).
Every row is scored by a model that never saw that row's source; history rows are grouped by
node, the stack whose readings they share.

Comparing the two MAPEs over every row has no power against broken readings: the candidate
gains on the new rows it learned from however wrong they are, and on the rows it already had
it moves by less than the noise of nested CV. So the gate asks two questions instead, each a
test with a stated null hypothesis, and accepts only when neither rejects:

1. **Are the new rows what the incumbent's calibration says rows look like?** Its conformal
   bound is valid only if new rows are exchangeable with the rows it was calibrated on. Per
   node group (a broken memory reading is a node's), the new rows' absolute out-of-fold
   log-residuals under the incumbent are compared with the incumbent's out-of-fold residuals
   of the old rows that calibrate a bound (the band's own scores). Each residual becomes a
   rank among the scores of its stratum: the metric's conformal strata, a task family with at
   least :data:`~predictor.conformal.MIN_FAMILY_SCORES` scores for peak VRAM (the rest pooled),
   one pool for times. The statistic is the node's mean normalised rank (one minus the mean of
   its rows' conformal p-values); its null distribution comes from re-drawing, within each
   stratum, which rows are the node's (a stratified permutation test of exchangeability,
   one-sided: only larger errors count). Residuals are absolute, not the band's signed upper
   scores, because a reading that is too low teaches the candidate to under-reserve, which is
   an OOM later. Rows that may not calibrate a bound (quirks, low confidence) are left out on
   both sides: the band makes no claim about them.
2. **Is the candidate worse on the rows it already had?** Per old row, the candidate's APE minus
   the incumbent's; the statistic is their sum, and its null distribution (no difference)
   flips the sign of each source group's sum (a paired permutation test over source groups,
   one-sided: only a worse candidate counts). Rows of one source are not independent, so the
   group, not the row, is the unit that is resampled.

The family-wise level is :data:`ALPHA`, split evenly over every test made (Bonferroni): when the
new rows are honest (exchangeable with the old) and the candidate no worse, a retrain is held
back with probability at most ``ALPHA``; it is then tried again with the next batch. The tests
are blind to what they cannot see: rows of a setup the incumbent predicts badly but honestly (a
genuine shift) are held back too, and are reported as such by node, for a person to look at;
a broken reading on a setup within the band's spread passes test 1 and is caught only if it
makes the old rows significantly worse. Permutations use a fixed seed, so a decision is
reproducible. The MAPEs are reported beside the p-values (the correction's, not the better of it
and the analytical tier's: the analytical fallback is the same for both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ._learned_cv import _POOLED, _ape, _metric_data, _MetricData, _nested
from ._learned_features import LEARNED_METRICS
from ._learned_regressor import DEFAULT_PARAMS
from .analytical import AnalyticalPredictor
from .conformal import MIN_FAMILY_SCORES
from .evaluation import TablePredictor, predicted_values
from .gpus import GPU_NAMES
from .measurements import Measurement

__all__ = ["ALPHA", "PERMUTATIONS", "compare_retrained", "consistency_p", "no_worse", "worse_p"]

#: Family-wise level of the gate: the most often an honest retrain is held back.
ALPHA = 0.05
#: Random permutations per test (the smallest p-value is 1 / (PERMUTATIONS + 1)).
PERMUTATIONS = 9999
_SEED = 0


def _procedure(d: _MetricData, n_splits: int, params: Mapping[str, Any], metric: str) -> np.ndarray:
    """The procedure's out-of-fold log-correction of every row."""
    corr = np.zeros(d.y.size)
    for f in _nested(d, n_splits, params, metric):
        corr[f.test] = f.correction
    return corr


def _strata(metric: str, families: np.ndarray, cal: np.ndarray) -> np.ndarray:
    """Each row's stratum: its family where the band has enough of its scores, else pooled."""
    min_scores = MIN_FAMILY_SCORES if metric == "peak_vram_gib" else _POOLED
    names, counts = np.unique(families[cal], return_counts=True)
    own = {str(f) for f, c in zip(names, counts, strict=True) if c >= min_scores}
    return np.array([f if f in own else "pooled" for f in families.tolist()])


def _normalised_ranks(values: np.ndarray) -> np.ndarray:
    """Mid-ranks of ``values`` divided by ``len + 1`` (ties share their rank)."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(1, values.size + 1)
    for v in np.unique(values):  # mid-ranks for ties
        tie = values == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks / (values.size + 1)


def consistency_p(
    residual: np.ndarray, mine: np.ndarray, scores: np.ndarray, strata: np.ndarray
) -> float:
    """Test 1 (module doc) for one node: ``residual[mine]`` against ``residual[scores]``."""
    if not mine.any():
        return 1.0
    rng = np.random.default_rng(_SEED)
    observed = 0.0
    null = np.zeros(PERMUTATIONS)
    for s in np.unique(strata[mine]):
        pool = (mine | scores) & (strata == s)
        ranks = _normalised_ranks(np.abs(residual[pool]))
        is_mine = mine[pool]
        observed += ranks[is_mine].sum()
        # Which of the stratum's rows are the node's, drawn again without replacement.
        draws = np.argsort(rng.random((PERMUTATIONS, ranks.size)), axis=1)[:, : is_mine.sum()]
        null += ranks[draws].sum(axis=1)
    return float((1 + np.sum(null >= observed - 1e-12)) / (PERMUTATIONS + 1))


def worse_p(diff: np.ndarray, groups: np.ndarray) -> float:
    """Test 2 (module doc): is ``sum(diff)`` (candidate APE − incumbent APE) above zero by more
    than flipping whole source groups' signs gives?"""
    sums = np.array([diff[groups == g].sum() for g in np.unique(groups)])
    signs = np.random.default_rng(_SEED).choice([-1.0, 1.0], size=(PERMUTATIONS, sums.size))
    null = signs @ sums
    return float((1 + np.sum(null >= sums.sum() - 1e-12)) / (PERMUTATIONS + 1))


def _apes(d: _MetricData, corr: np.ndarray) -> np.ndarray:
    return np.abs(np.expm1(corr - d.y))


def _figures(
    d: _MetricData, new_rows: np.ndarray, inc: np.ndarray, cand: np.ndarray, metric: str
) -> dict[str, Any]:
    """The figures :func:`compare_retrained` reports for one metric, the two tests included."""
    old = ~new_rows
    residual = d.y - inc
    scores = old & d.calibrate
    strata = _strata(metric, d.families, scores)
    nodes: dict[str, dict[str, float]] = {}
    for g in sorted(set(d.groups[new_rows].tolist())):
        mine = new_rows & d.calibrate & (d.groups == g)
        nodes[str(g)] = {
            "n_tested": float(mine.sum()),
            "median_abs_residual": float(np.median(np.abs(residual[mine]))) if mine.any() else 0.0,
            "p": consistency_p(residual, mine, scores, strata),
        }
    return {
        "n": float(d.y.size),
        "n_new": float(new_rows.sum()),
        "analytical_mape": _ape(d.y, np.zeros(d.y.size)),
        "incumbent_mape": _ape(d.y, inc),
        "candidate_mape": _ape(d.y, cand),
        "old_incumbent_mape": _ape(d.y[old], inc[old]),
        "old_candidate_mape": _ape(d.y[old], cand[old]),
        "calibration_median_abs_residual": (
            float(np.median(np.abs(residual[scores]))) if scores.any() else 0.0
        ),
        "worse_p": worse_p(_apes(d, cand)[old] - _apes(d, inc)[old], d.groups[old]),
        "nodes": nodes,
    }


def compare_retrained(
    measurements: Sequence[Measurement],
    new: Sequence[bool],
    *,
    base: TablePredictor | None = None,
    n_splits: int = 5,
    params: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per metric that the new rows measure: ``n`` rows, ``n_new``, the MAPEs of the analytical
    tier, the incumbent and the candidate over every row and (``old_*``) over the old rows, the
    paired test's ``worse_p``, and per new node group (``nodes``) the rows tested, their median
    absolute residual under the incumbent and the consistency test's ``p`` (module doc; beside
    it the band's ``calibration_median_abs_residual``). Metrics without a new row, or with too
    few rows or sources for grouped CV, are left out: nothing to say there."""
    is_new = np.asarray(new, dtype=bool)
    if is_new.shape != (len(measurements),):
        raise ValueError(f"`new` needs one flag per measurement; got {is_new.shape}")
    params = dict(params or DEFAULT_PARAMS)
    base = base or AnalyticalPredictor()
    table = base.predict_table([m.spec for m in measurements], GPU_NAMES)
    pv = predicted_values(measurements, lambda s, g: table)
    out: dict[str, dict[str, Any]] = {}
    for metric in LEARNED_METRICS:
        d = _metric_data(measurements, table, pv, metric)
        new_rows = is_new[d.idx]
        if not new_rows.any() or d.y.size < 8 or len(set(d.groups.tolist())) < 3:
            continue
        inc = _procedure(replace(d, train=d.train & ~new_rows), n_splits, params, metric)
        cand = _procedure(d, n_splits, params, metric)
        out[metric] = _figures(d, new_rows, inc, cand, metric)
    return out


def no_worse(cv: Mapping[str, Mapping[str, Any]], alpha: float = ALPHA) -> tuple[bool, str]:
    """The decision on :func:`compare_retrained`'s figures, and why (module doc)."""
    if not cv:
        return False, "no metric the new rows measure has enough rows and sources to compare"
    n_tests = sum(1 + len(v["nodes"]) for v in cv.values())
    level = alpha / n_tests
    failed = []
    for m, v in cv.items():
        for g, t in v["nodes"].items():
            if t["p"] <= level:
                failed.append(
                    f"{m}: {g}'s rows are off the incumbent's calibrated residuals (median "
                    f"|log error| {t['median_abs_residual']:.2f} vs "
                    f"{v['calibration_median_abs_residual']:.2f}, p={t['p']:.4f})"
                )
        if v["worse_p"] <= level:
            failed.append(
                f"{m}: candidate worse on the old rows ({v['old_candidate_mape']:.2%} vs "
                f"{v['old_incumbent_mape']:.2%}, p={v['worse_p']:.4f})"
            )
    if failed:
        return False, f"rejected at p <= {level:.4f} ({n_tests} tests): " + "; ".join(failed)
    figures = ", ".join(
        f"{m} old rows {v['old_candidate_mape']:.2%} vs {v['old_incumbent_mape']:.2%} "
        f"(p={v['worse_p']:.2f}), all rows {v['candidate_mape']:.2%}"
        for m, v in cv.items()
    )
    return True, f"new rows consistent and candidate no worse at p > {level:.4f}: " + figures
