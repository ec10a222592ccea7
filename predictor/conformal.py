"""Calibrated upper bounds from out-of-fold residuals (split-conformal / CV+ style).

Scores are log-ratios ``log(measured / predicted)`` computed out of fold, so each one is an
honest "how far off was a model that never saw this row". The upper bound multiplies a point
prediction by ``exp(q)``, where ``q`` is the finite-sample conformal quantile of the scores of the
job's task family at the requested coverage. A one-sided bound is what the scheduler needs: it
reserves the upper bound, and only under-prediction causes an OOM.

With the small published data a family may have few scores; below ``min_scores`` (30) it
borrows the pooled scores of its *base* (traced or analytical points: they err differently),
as long as the base has enough for the finite-sample rule to exist at the coverage
(``n ≥ c / (1 − c)``: 19 scores at 95%); only a base with fewer borrows every family's scores.
Mixing bases would let the analytical tier's worst rows set the traced tier's bound.

Documented targets: ``peak_vram_upper_gib`` covers :data:`DEFAULT_COVERAGE` (95%) of runs,
``runtime_upper_s`` :data:`RUNTIME_COVERAGE` (90%: a late job costs money, an OOM kills it), and
reservations that must not fail ask for :data:`RESERVATION_COVERAGE` (99%).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .exceptions import DataError, NotFittedError

__all__ = [
    "DEFAULT_COVERAGE",
    "MIN_FAMILY_SCORES",
    "RESERVATION_COVERAGE",
    "RUNTIME_COVERAGE",
    "ConformalUpper",
    "base_family",
    "conformal_quantile",
    "min_valid_scores",
    "source_weighted_quantile",
    "task_family",
]

DEFAULT_COVERAGE = 0.95
RUNTIME_COVERAGE = 0.90
RESERVATION_COVERAGE = 0.99
MIN_FAMILY_SCORES = 30

_FAMILIES = {
    "inference": "inference",
    "serve": "inference",  # a serve replica is predicted as inference (see _jobarrays)
    "lora": "peft",
    "qlora": "peft",
    "full_finetune": "training",
    "pretrain": "training",
}


def task_family(task: str) -> str:
    """Calibration group of a task: ``inference``, ``peft`` or ``training``."""
    try:
        return _FAMILIES[task]
    except KeyError:
        raise DataError(f"unknown task {task!r}; use one of {', '.join(_FAMILIES)}") from None


#: Suffix of a calibration group whose point came from the traced tier (see ``base_family``).
TRACED_SUFFIX = "@traced"


def base_family(task: str, traced: bool) -> str:
    """Calibration group of a task *and its base*: traced points err differently from
    analytical ones, so each base gets its own bound (``peft`` vs ``peft@traced``)."""
    return task_family(task) + (TRACED_SUFFIX if traced else "")


def _base_of(family: str) -> str:
    return TRACED_SUFFIX if family.endswith(TRACED_SUFFIX) else ""


def min_valid_scores(coverage: float) -> int:
    """The fewest scores for which the split-conformal rank ``ceil((n+1)·c)`` is at most
    ``n``, so the bound keeps its finite-sample coverage guarantee (19 at 95%)."""
    return math.ceil(coverage / (1.0 - coverage) - 1e-9)


def conformal_quantile(scores: np.ndarray, coverage: float) -> float:
    """The ``ceil((n+1)·coverage)/n`` empirical quantile (split-conformal finite-sample rule).

    With too few scores for the requested coverage (``k > n``) the largest score is used: the
    finite-sample guarantee no longer holds there, which the achieved coverage then reports.
    """
    s = np.sort(np.asarray(scores, dtype=float))
    s = s[np.isfinite(s)]
    n = s.size
    if n == 0:
        raise DataError("no calibration scores; fit on at least one measured row")
    if not 0.0 < coverage < 1.0:
        raise DataError(f"coverage must be in (0, 1), got {coverage}")
    k = math.ceil((n + 1) * coverage)
    if k > n:
        return float(s[-1])
    return float(s[k - 1])


def source_weighted_quantile(
    scores: np.ndarray, groups: Sequence[str] | np.ndarray, coverage: float
) -> float:
    """The conformal quantile when the exchangeable unit is the *source*, not the row.

    Grouped CV asks how a setup never seen fares, and rows of one source share its errors, so
    a source with many rows would otherwise set the quantile alone. Each of the ``S`` sources
    carries one unit of mass, split evenly over its rows (the pooled-CDF construction of Dunn,
    Wasserman and Ramdas, "Distribution-free prediction sets for two-layer hierarchical
    models", JASA 2022), and the finite-sample rule counts sources: the smallest score whose
    cumulative mass reaches ``coverage · (S + 1)``; the largest when no score does, which is
    every case with fewer than ``coverage / (1 − coverage)`` sources (19 at 95%).
    """
    s = np.asarray(scores, dtype=float)
    g = np.asarray(groups)
    ok = np.isfinite(s)
    s, g = s[ok], g[ok]
    if s.size == 0:
        raise DataError("no calibration scores; fit on at least one measured row")
    if not 0.0 < coverage < 1.0:
        raise DataError(f"coverage must be in (0, 1), got {coverage}")
    names, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
    order = np.argsort(s, kind="stable")
    mass = np.cumsum(1.0 / counts[inverse][order])
    k = int(np.searchsorted(mass, coverage * (names.size + 1) - 1e-9))
    return float(s[order][min(k, s.size - 1)])


@dataclass
class ConformalUpper:
    """Per-family upper-bound multipliers from out-of-fold log-ratio scores."""

    coverage: float = DEFAULT_COVERAGE
    min_scores: int = MIN_FAMILY_SCORES

    def fit(self, scores: Sequence[float] | np.ndarray, families: Sequence[str]) -> ConformalUpper:
        s = np.asarray(scores, dtype=float)
        fam = np.asarray(families)
        if s.shape != fam.shape:
            raise DataError(f"scores and families differ in length: {s.shape[0]} vs {fam.shape[0]}")
        ok = np.isfinite(s)
        s, fam = s[ok], fam[ok]
        self.scores_: dict[str, np.ndarray] = {f: s[fam == f] for f in sorted(set(fam.tolist()))}
        self.pooled_ = s
        self.quantiles_: dict[str, float] = {}
        # A small family borrows the pooled scores of its own base first (traced points are
        # not as wrong as analytical ones), then of every family.
        base_of = np.array([_base_of(str(f)) for f in fam])
        self.base_pooled_: dict[str, np.ndarray] = {
            b: s[base_of == b] for b in sorted(set(base_of.tolist()))
        }
        enough = min(self.min_scores, min_valid_scores(self.coverage))
        for f, fs in self.scores_.items():
            bs = self.base_pooled_.get(_base_of(f), s)
            src = fs if fs.size >= self.min_scores else bs if bs.size >= enough else s
            # Never tighter than zero: the bound must not sit below the point prediction.
            self.quantiles_[f] = max(0.0, conformal_quantile(src, self.coverage))
        self.base_quantiles_ = {
            b: max(0.0, conformal_quantile(bs if bs.size >= enough else s, self.coverage))
            for b, bs in self.base_pooled_.items()
        }
        self.pooled_quantile_ = max(0.0, conformal_quantile(s, self.coverage)) if s.size else 0.0
        return self

    def _check(self) -> None:
        if not hasattr(self, "quantiles_"):
            raise NotFittedError("ConformalUpper is not fitted; call fit(scores, families) first")

    def log_margin(self, families: Sequence[str]) -> np.ndarray:
        self._check()
        base = getattr(self, "base_quantiles_", {})
        return np.array(
            [self.quantiles_.get(f, base.get(_base_of(f), self.pooled_quantile_)) for f in families]
        )

    def upper(self, point: np.ndarray, families: Sequence[str]) -> np.ndarray:
        return np.asarray(point, dtype=float) * np.exp(self.log_margin(families))

    def state(self) -> dict[str, object]:
        """JSON-ready state (the raw scores, so any coverage can be recomputed on load)."""
        self._check()
        return {
            "coverage": self.coverage,
            "min_scores": self.min_scores,
            "scores": {f: [round(float(x), 6) for x in v] for f, v in self.scores_.items()},
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, object], coverage: float | None = None
    ) -> ConformalUpper:
        raw = state.get("scores")
        if not isinstance(raw, Mapping):
            raise DataError("conformal state has no `scores` mapping")
        cov = float(coverage if coverage is not None else state.get("coverage", DEFAULT_COVERAGE))  # type: ignore[arg-type]
        fams: list[str] = []
        vals: list[float] = []
        for f, v in raw.items():
            fams += [str(f)] * len(v)
            vals += [float(x) for x in v]
        min_scores = state.get("min_scores", MIN_FAMILY_SCORES)
        return cls(coverage=cov, min_scores=int(min_scores)).fit(vals, fams)  # type: ignore[call-overload]
