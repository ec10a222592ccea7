"""The learned tier: corrections of the analytical tier, with calibrated upper bounds.

The analytical tier gets the shape right and the constants wrong, so the learned tier predicts
``log(measured / analytical)`` per metric (peak VRAM, step time, TTFT, TPOT) from a handful of
physically meaningful features (task, framework family, measurement kind, model size, the
analytical breakdown shares, tokens per GPU, parallelism, the GPU's bandwidth) and multiplies
the analytical figure by ``exp(λ · correction)``. Learning a *ratio* keeps the physics: a job far
outside the data still gets the analytical answer times a bounded factor.

Small-data discipline (about 60 VRAM rows from 12 sources, a few hundred runtime rows from 4-6):

* heavy regularisation: LightGBM with 4 leaves, depth 2, ``min_data_in_leaf`` 20, L2 10;
* a monotone constraint where physics demands it (VRAM correction vs tokens per GPU);
* shrinkage ``λ`` of the correction toward zero, chosen by grouped CV; every reported CV
  figure is *nested* (the shrinkage of an outer fold is chosen on its training sources only);
* grouped cross-validation by **source**: every CV figure is "a setup never seen";
* a metric whose nested grouped-CV error is not better than the analytical tier's is
  **disabled** and falls back to analytical (``fallback_`` says so), and then ``method`` says
  ``analytical+conformal:<version>``: only the bounds come from the artifact;
* rows tagged as documented quirks never train; quirks and low-confidence rows never calibrate;
* upper bounds are split-conformal quantiles of out-of-fold log-ratios per task family
  (Mondrian, pooled below 30 scores): 95% for VRAM, 90% for time, 99% via ``with_coverage``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._learned_cv import (
    SHRINK_GRID,
    CVResult,
    _choose_shrink,
    _conformal,
    _metric_data,
    _nested_score,
    _oof,
    cross_validate,
    metric_coverage,
)
from ._learned_features import (
    FEATURE_NAMES,
    LEARNED_METRICS,
    PREDICT_KIND,
    _is_traced,
    _monotone,
    _traced_method,
    feature_matrix,
)
from ._learned_regressor import DEFAULT_PARAMS, ResidualRegressor, check_is_fitted
from ._learned_regressor import DEFAULT_ROUNDS as DEFAULT_ROUNDS  # re-exported
from ._learned_regressor import MAX_LOG_CORRECTION as MAX_LOG_CORRECTION  # re-exported
from .analytical import AnalyticalPredictor
from .conformal import DEFAULT_COVERAGE, RUNTIME_COVERAGE, ConformalUpper, base_family
from .evaluation import TablePredictor, predicted_values
from .exceptions import DataError
from .gpus import GPU_NAMES, get_gpu
from .measurements import Measurement
from .prediction import PredictionTable
from .spec import JobSpec

__all__ = [
    "DEFAULT_PARAMS",
    "FEATURE_NAMES",
    "LEARNED_METRICS",
    "PREDICT_KIND",
    "SHRINK_GRID",
    "CVResult",
    "LearnedPredictor",
    "ResidualRegressor",
    "check_is_fitted",
    "cross_validate",
    "feature_matrix",
    "metric_coverage",
    "training_data_hash",
]


def training_data_hash(measurements: Sequence[Measurement]) -> str:
    """SHA-256 of the canonical JSON of every training row (order-independent)."""
    lines = sorted(json.dumps(m.to_row(), sort_keys=True) for m in measurements)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# Which metrics' corrections touch a job of each task (``learned:`` only when one does).
_APPLIES: dict[str, Callable[[JobSpec], bool]] = {
    "peak_vram_gib": lambda s: True,
    "step_time_s": lambda s: s.task.is_training,
    "ttft_s": lambda s: not s.task.is_training,
    "tpot_s": lambda s: not s.task.is_training,
}


# ------------------------------------------------------------------------------ predictor
class LearnedPredictor:
    """Analytical tier × learned per-metric corrections, with conformal upper bounds.

    After ``fit``: ``models_`` (metric → :class:`ResidualRegressor` or None when the metric
    fell back), ``shrink_`` (metric → factor in [0, 1] applied to the correction, chosen by
    grouped CV), ``conformal_`` (metric → :class:`ConformalUpper`), ``cv_`` (nested grouped-CV
    MAPE of both tiers per metric), ``fallback_`` (metric → reason, for disabled metrics),
    ``version_`` and ``data_hash_``.

    ``coverage`` is the target of ``peak_vram_upper_gib`` (default 95%, the documented
    figure); ``runtime_coverage`` that of ``runtime_upper_s`` (default 90%).
    ``with_coverage(0.99)`` gives the reservation bounds.
    """

    def __init__(
        self,
        coverage: float = DEFAULT_COVERAGE,
        n_splits: int = 5,
        params: Mapping[str, Any] | None = None,
        base: TablePredictor | None = None,
        runtime_coverage: float = RUNTIME_COVERAGE,
    ) -> None:
        self.coverage = coverage
        self.runtime_coverage = runtime_coverage
        self.n_splits = n_splits
        self.params = dict(params or DEFAULT_PARAMS)
        self.base = base or AnalyticalPredictor()

    # -- fitting
    def fit(
        self, measurements: Sequence[Measurement], version_date: str | None = None
    ) -> LearnedPredictor:
        import datetime as dt

        if not measurements:
            raise DataError("no measurements to train on; check datasets/measured/")
        specs = [m.spec for m in measurements]
        table = self.base.predict_table(specs, GPU_NAMES)
        pv = predicted_values(measurements, lambda s, g: table)
        self.models_: dict[str, ResidualRegressor | None] = {}
        self.shrink_: dict[str, float] = {}
        self.conformal_: dict[str, ConformalUpper] = {}
        self.cv_: dict[str, dict[str, float]] = {}
        self.fallback_: dict[str, str] = {}
        for metric in LEARNED_METRICS:
            d = _metric_data(measurements, table, pv, metric)
            cov = metric_coverage(metric, self.coverage, self.runtime_coverage)
            self.models_[metric] = None
            self.shrink_[metric] = 0.0
            n_groups = len(set(d.groups[d.train].tolist()))
            if d.y.size < 8 or n_groups < 3:
                self.fallback_[metric] = (
                    f"only {d.y.size} measured rows from {n_groups} source(s); analytical used"
                )
                if d.calibrate.any():
                    self.conformal_[metric] = _conformal(metric, cov).fit(
                        d.y[d.calibrate], d.families[d.calibrate].tolist()
                    )
                continue
            folds, _, cmp = _nested_score(d, self.n_splits, self.params, metric)
            mono = _monotone(metric)
            oof = _oof(d.X, d.y, d.groups, self.n_splits, self.params, mono, d.train)
            lam = _choose_shrink(d.y[d.train], oof[d.train])
            self.cv_[metric] = {
                "n": float(d.y.size),
                "n_groups": float(len(set(d.groups.tolist()))),
                **cmp,
                "shrink": lam,
                "fold_shrinks": float(np.mean([f.shrink for f in folds])),
            }
            scores = d.y
            if cmp["learned_mape"] < cmp["analytical_mape"] and lam > 0:
                self.models_[metric] = ResidualRegressor(params=self.params, monotone=mono).fit(
                    d.X[d.train], d.y[d.train]
                )
                self.shrink_[metric] = lam
                scores = d.y - lam * oof
            else:
                self.fallback_[metric] = (
                    f"nested grouped-CV MAPE {cmp['learned_mape']:.1%} is not better than "
                    f"analytical {cmp['analytical_mape']:.1%}; analytical used"
                )
            cal = d.calibrate
            conf = _conformal(metric, cov)
            self.conformal_[metric] = conf.fit(scores[cal], d.families[cal].tolist())
        self.data_hash_ = training_data_hash(measurements)
        date = version_date or dt.date.today().isoformat()
        self.version_ = f"{date}-{self.data_hash_[:8]}"
        self.n_rows_ = len(measurements)
        return self

    @property
    def enabled_metrics(self) -> tuple[str, ...]:
        check_is_fitted(self, ["models_"])
        return tuple(
            m for m, est in self.models_.items() if est is not None and self.shrink_.get(m, 1.0)
        )

    @property
    def method(self) -> str:
        """``learned:<ver>`` when any correction is on, else ``analytical+conformal:<ver>``."""
        check_is_fitted(self, ["version_"])
        if self.enabled_metrics:
            return f"learned:{self.version_}"
        return f"analytical+conformal:{self.version_}"

    def job_method(self, spec: JobSpec) -> str:
        """What answered this job: a correction that applies to its task, or only the bounds."""
        check_is_fitted(self, ["version_"])
        if any(_APPLIES[m](spec) for m in self.enabled_metrics):
            return f"learned:{self.version_}"
        return f"analytical+conformal:{self.version_}"

    def with_coverage(
        self, coverage: float, runtime_coverage: float | None = None
    ) -> LearnedPredictor:
        """The same corrections with bounds re-calibrated (e.g. 0.99 for reservations)."""
        check_is_fitted(self, ["conformal_"])
        rt = coverage if runtime_coverage is None else runtime_coverage
        other = LearnedPredictor(coverage, self.n_splits, self.params, self.base, rt)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k.endswith("_")})
        other.conformal_ = {
            m: ConformalUpper.from_state(c.state(), metric_coverage(m, coverage, rt))
            for m, c in self.conformal_.items()
        }
        return other

    # -- prediction
    def corrections(
        self, specs: Sequence[JobSpec], table: PredictionTable
    ) -> dict[str, np.ndarray]:
        """Log-corrections per metric, shape ``(n_jobs, n_gpus)`` (0 where a metric fell back)."""
        check_is_fitted(self, ["models_"])
        n, g = table.peak_vram_gib.shape
        rows = np.repeat(np.arange(n), g)
        cols = np.tile(np.arange(g), n)
        base = {
            "peak_vram_gib": table.peak_vram_gib - table.breakdown_gib["overhead"],
            "step_time_s": table.step_time_s,
            "ttft_s": table.ttft_s,
            "tpot_s": table.tpot_s,
        }
        out: dict[str, np.ndarray] = {}
        for metric in LEARNED_METRICS:
            model = self.models_.get(metric)
            lam = float(getattr(self, "shrink_", {}).get(metric, 1.0))
            b = base[metric]
            if model is None or n == 0 or lam == 0.0:
                out[metric] = np.zeros((n, g))
                continue
            valid = np.isfinite(b) & (b > 0)
            X = feature_matrix(specs, table, rows, cols, metric)
            corr = lam * model.predict(X).reshape(n, g)
            out[metric] = np.where(valid, corr, 0.0)
        return out

    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable:
        check_is_fitted(self, ["models_", "conformal_"])
        t = self.base.predict_table(specs, gpus)
        if len(specs) == 0:
            return t
        c = self.corrections(specs, t)
        fams = [base_family(s.task.value, _is_traced(t.method[i])) for i, s in enumerate(specs)]
        ovh = t.breakdown_gib["overhead"]
        tensors = t.peak_vram_gib - ovh
        scale = np.exp(c["peak_vram_gib"])
        # Every tensor component scales with the correction, so the breakdown still sums to
        # the peak; overhead (no tensor holds it) is left as the analytical tier gave it.
        breakdown = {k: (v * scale if k != "overhead" else v) for k, v in t.breakdown_gib.items()}
        peak = tensors * scale + ovh

        def margin(metric: str) -> np.ndarray:
            conf = self.conformal_.get(metric)
            if conf is None:
                return np.zeros((len(specs), 1))
            return conf.log_margin(fams)[:, None]

        upper = tensors * scale * np.exp(margin("peak_vram_gib")) + ovh
        step = t.step_time_s * np.exp(c["step_time_s"])
        ttft = t.ttft_s * np.exp(c["ttft_s"])
        tpot = t.tpot_s * np.exp(c["tpot_s"])
        is_train = np.array([s.task.is_training for s in specs])[:, None]
        # Inference runtime = prefill share × TTFT correction + decode share × TPOT correction.
        decode = (
            np.nan_to_num(t.tpot_s) * np.array([float(s.output_len or 0) for s in specs])[:, None]
        )
        prefill = np.nan_to_num(t.ttft_s)
        w = prefill / np.maximum(prefill + decode, 1e-12)
        infer_scale = w * np.exp(c["ttft_s"]) + (1 - w) * np.exp(c["tpot_s"])
        rt_scale = np.where(is_train, np.exp(c["step_time_s"]), infer_scale)
        runtime = t.runtime_s * rt_scale
        rt_margin = np.where(
            is_train, margin("step_time_s"), np.maximum(margin("ttft_s"), margin("tpot_s"))
        )
        capacity = np.array([get_gpu(g).memory_gib for g in t.gpu_names])[None, :]
        return PredictionTable(
            job_ids=t.job_ids,
            gpu_names=t.gpu_names,
            peak_vram_gib=peak,
            peak_vram_upper_gib=upper,
            runtime_s=runtime,
            runtime_upper_s=runtime * np.exp(rt_margin),
            breakdown_gib=breakdown,
            step_time_s=step,
            ttft_s=ttft,
            tpot_s=tpot,
            fits=upper <= capacity,
            method=tuple(
                _traced_method(self.job_method(s))
                if _is_traced(t.method[i])
                else self.job_method(s)
                for i, s in enumerate(specs)
            ),
            busy_frac=t.busy_frac,
        )
