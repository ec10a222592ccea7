"""The learned tier: LightGBM corrections of the analytical tier, with calibrated upper bounds.

The analytical tier gets the shape right and the constants wrong, so the learned tier predicts
``log(measured / analytical)`` per metric (peak VRAM, step time, TTFT, TPOT) from the spec, the
analytical breakdown shares and the GPU's numbers, and multiplies the analytical figure by
``exp(correction)``. Learning a *ratio* keeps the physics: a job far outside the data still gets
the analytical answer times a bounded factor, never a number the trees made up.

Small-data discipline (about 60 VRAM rows and a few hundred runtime rows):

* heavy regularisation (shallow trees, few leaves, large ``min_data_in_leaf``, L2, shrinkage);
* monotone constraints: the correction may not fall as the batch or the sequence grows, so the
  corrected prediction stays non-decreasing in them wherever the analytical one is;
* grouped cross-validation by **source**: every CV figure is "a setup never seen";
* a metric whose grouped-CV error is not better than the analytical tier's is **disabled** and
  falls back to analytical (``fallback_`` says so);
* upper bounds are split-conformal quantiles of out-of-fold log-ratios per task family.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._jobarrays import DTYPES, job_arrays
from .analytical import AnalyticalPredictor
from .conformal import DEFAULT_COVERAGE, ConformalUpper, task_family
from .evaluation import (
    EvalReport,
    PredictedValues,
    TablePredictor,
    evaluate,
    predicted_values,
    source_group,
    summarise,
)
from .exceptions import DataError, NotFittedError
from .gpus import GPU_NAMES, get_gpu
from .measurements import Measurement
from .prediction import BREAKDOWN_KEYS, PredictionTable
from .spec import JobSpec

__all__ = [
    "DEFAULT_PARAMS",
    "FEATURE_NAMES",
    "LEARNED_METRICS",
    "CVResult",
    "LearnedPredictor",
    "ResidualRegressor",
    "check_is_fitted",
    "cross_validate",
    "feature_matrix",
    "training_data_hash",
]

#: Metrics the learned tier corrects; ``runtime_s`` is derived from them.
LEARNED_METRICS: tuple[str, ...] = ("peak_vram_gib", "step_time_s", "ttft_s", "tpot_s")

_JOB_FEATURES: tuple[str, ...] = (
    "log_total_params",
    "log_active_params",
    "is_moe",
    "task",
    "framework",
    "weight_bytes",
    "compute_bytes",
    "log_batch",
    "log_seq",
    "log_output_len",
    "checkpointing",
    "log_lora_params",
    "zero_stage",
    "log_n_gpus",
    "tp",
    "pp",
)
_GPU_FEATURES: tuple[str, ...] = ("log_hbm_bandwidth_gbps", "log_peak_tflops", "memory_gib")
_SHARE_FEATURES: tuple[str, ...] = tuple(f"share_{k}" for k in BREAKDOWN_KEYS)
FEATURE_NAMES: tuple[str, ...] = (
    *_JOB_FEATURES,
    *_GPU_FEATURES,
    *_SHARE_FEATURES,
    "log_analytical",
)
# A bigger batch or a longer sequence never uses less memory or time.
_MONOTONE_UP: frozenset[str] = frozenset({"log_batch", "log_seq"})

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "huber",
    "alpha": 0.3,
    "learning_rate": 0.05,
    "num_leaves": 6,
    "max_depth": 3,
    "min_data_in_leaf": 8,
    "lambda_l2": 5.0,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "min_data_in_bin": 1,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "seed": 7,
}
DEFAULT_ROUNDS = 150
#: Largest correction, as a log factor (×/÷ 3): outside the data the trees extrapolate flat,
#: and a bounded factor keeps a wild fold from overriding the physics.
MAX_LOG_CORRECTION = float(np.log(3.0))


def check_is_fitted(estimator: object, attributes: Sequence[str]) -> None:
    """scikit-learn's idiom with this package's error type."""
    missing = [a for a in attributes if not hasattr(estimator, a)]
    if missing:
        raise NotFittedError(
            f"{type(estimator).__name__} is not fitted (missing {', '.join(missing)}); "
            "call fit() or load a trained artifact first"
        )


# ------------------------------------------------------------------------------ features
def _peak_tflops(gpu: str, compute_idx: np.ndarray) -> np.ndarray:
    g = get_gpu(gpu)
    return np.array([g.peak_tflops_for(DTYPES[int(k)].value) for k in compute_idx])


def feature_matrix(
    specs: Sequence[JobSpec],
    table: PredictionTable,
    rows: np.ndarray,
    cols: np.ndarray,
    base_values: np.ndarray,
) -> np.ndarray:
    """Features for (job ``rows[k]``, GPU column ``cols[k]``) pairs; shape ``(k, n_features)``.

    ``base_values`` is the analytical value of the metric being corrected for each pair.
    """
    j = job_arrays(specs)
    seq = np.where(j.task == 0, j.input_len, j.seq_len)
    job = np.column_stack(
        [
            np.log(j.total_params / 1e9),
            np.log(np.maximum(j.active_params, 1.0) / 1e9),
            j.is_moe,
            j.task,
            j.framework,
            j.weight_bytes,
            j.compute_bytes,
            np.log(j.batch),
            np.log(np.maximum(seq, 1.0)),
            np.log1p(j.output_len),
            j.checkpointing,
            np.log1p(j.lora_params),
            j.zero_stage,
            np.log(j.n_gpus),
            j.tp,
            j.pp,
        ]
    )[rows]
    gpu_names = table.gpu_names
    bw = np.log([get_gpu(g).hbm_bandwidth_gbps for g in gpu_names])[cols]
    mem = np.array([get_gpu(g).memory_gib for g in gpu_names])[cols]
    tflops = np.empty(len(rows))
    for c, g in enumerate(gpu_names):
        sel = cols == c
        if sel.any():
            tflops[sel] = np.log(_peak_tflops(g, j.compute_dtype[rows[sel]]))
    peak = table.peak_vram_gib[rows, cols]
    shares = np.column_stack(
        [table.breakdown_gib[k][rows, cols] / np.maximum(peak, 1e-9) for k in BREAKDOWN_KEYS]
    )
    return np.column_stack(
        [job, bw, tflops, mem, shares, np.log(np.maximum(base_values, 1e-12))]
    ).astype(np.float64)


# ------------------------------------------------------------------------------ estimator
@dataclass
class ResidualRegressor:
    """LightGBM on a log-ratio target, scikit-learn style (``fit`` returns self)."""

    params: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    num_rounds: int = DEFAULT_ROUNDS
    feature_names: Sequence[str] = FEATURE_NAMES

    def _lgb_params(self, n: int) -> dict[str, Any]:
        p = dict(self.params)
        # Never ask for leaves larger than half the data: with 20 rows that is one split.
        p["min_data_in_leaf"] = int(min(p.get("min_data_in_leaf", 8), max(2, n // 3)))
        p["monotone_constraints"] = [1 if f in _MONOTONE_UP else 0 for f in self.feature_names]
        p["monotone_constraints_method"] = "basic"
        return p

    def fit(self, X: np.ndarray, y: np.ndarray) -> ResidualRegressor:
        import lightgbm as lgb

        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if X.shape[0] != y.shape[0] or X.shape[0] < 2:
            raise DataError(
                f"need ≥ 2 rows with matching X and y to fit, got X {X.shape} and y {y.shape}"
            )
        ds = lgb.Dataset(X, label=y, feature_name=list(self.feature_names), free_raw_data=True)
        self.booster_ = lgb.train(self._lgb_params(X.shape[0]), ds, num_boost_round=self.num_rounds)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        check_is_fitted(self, ["booster_"])
        out = self.booster_.predict(np.asarray(X, dtype=float))
        return np.clip(np.asarray(out, dtype=float), -MAX_LOG_CORRECTION, MAX_LOG_CORRECTION)

    @classmethod
    def from_model_string(cls, text: str) -> ResidualRegressor:
        import lightgbm as lgb

        est = cls()
        est.booster_ = lgb.Booster(model_str=text)
        est.n_features_in_ = est.booster_.num_feature()
        return est


# ------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class _MetricData:
    idx: np.ndarray  # measurement indices with this metric measured and predicted
    X: np.ndarray
    y: np.ndarray  # log(measured / analytical)
    base: np.ndarray  # analytical point (kind-adjusted)
    groups: np.ndarray  # source group per row
    families: np.ndarray  # task family per row


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
    X = (
        feature_matrix(specs, table, idx, cols, base[idx])
        if idx.size
        else np.empty((0, len(FEATURE_NAMES)))
    )
    return _MetricData(
        idx=idx,
        X=X,
        y=np.log(measured[idx] / base[idx]),
        base=base[idx],
        groups=np.array([source_group(measurements[int(i)]) for i in idx]),
        families=np.array([task_family(measurements[int(i)].spec.task.value) for i in idx]),
    )


def _oof(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, n_splits: int, params: Mapping[str, Any]
) -> np.ndarray:
    """Out-of-fold predictions of the log-ratio with GroupKFold; 0 where a fold cannot fit."""
    from sklearn.model_selection import GroupKFold

    out = np.zeros(len(y))
    k = min(n_splits, len(set(groups.tolist())))
    if k < 2:
        return out
    for tr, te in GroupKFold(n_splits=k).split(X, y, groups):
        if tr.size < 4:
            continue
        out[te] = ResidualRegressor(params=params).fit(X[tr], y[tr]).predict(X[te])
    return out


def training_data_hash(measurements: Sequence[Measurement]) -> str:
    """SHA-256 of the canonical JSON of every training row (order-independent)."""
    lines = sorted(json.dumps(m.to_row(), sort_keys=True) for m in measurements)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ------------------------------------------------------------------------------ predictor
class LearnedPredictor:
    """Analytical tier × learned per-metric corrections, with conformal upper bounds.

    After ``fit``: ``models_`` (metric → :class:`ResidualRegressor` or None when the metric
    fell back), ``conformal_`` (metric → :class:`ConformalUpper`), ``cv_`` (grouped-CV MAPE of
    both tiers per metric), ``fallback_`` (metric → reason, for disabled metrics),
    ``version_`` and ``data_hash_``.
    """

    def __init__(
        self,
        coverage: float = DEFAULT_COVERAGE,
        n_splits: int = 5,
        params: Mapping[str, Any] | None = None,
        base: TablePredictor | None = None,
    ) -> None:
        self.coverage = coverage
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
        self.conformal_: dict[str, ConformalUpper] = {}
        self.cv_: dict[str, dict[str, float]] = {}
        self.fallback_: dict[str, str] = {}
        for metric in LEARNED_METRICS:
            d = _metric_data(measurements, table, pv, metric)
            if d.y.size < 8:
                self.models_[metric] = None
                self.fallback_[metric] = f"only {d.y.size} measured rows; analytical used"
                if d.y.size:
                    self.conformal_[metric] = ConformalUpper(self.coverage).fit(
                        d.y, d.families.tolist()
                    )
                continue
            oof = _oof(d.X, d.y, d.groups, self.n_splits, self.params)
            measured = d.base * np.exp(d.y)
            a = summarise(measured, d.base, d.base)
            lrn = summarise(measured, d.base * np.exp(oof), d.base * np.exp(oof))
            self.cv_[metric] = {
                "n": float(d.y.size),
                "n_groups": float(len(set(d.groups.tolist()))),
                "analytical_mape": a.mape,
                "learned_mape": lrn.mape,
                "analytical_median_ape": a.median_ape,
                "learned_median_ape": lrn.median_ape,
            }
            if lrn.mape < a.mape:
                self.models_[metric] = ResidualRegressor(params=self.params).fit(d.X, d.y)
                scores = d.y - oof
            else:
                self.models_[metric] = None
                self.fallback_[metric] = (
                    f"grouped CV MAPE {lrn.mape:.1%} is not better than analytical "
                    f"{a.mape:.1%}; analytical used"
                )
                scores = d.y
            self.conformal_[metric] = ConformalUpper(self.coverage).fit(scores, d.families.tolist())
        self.data_hash_ = training_data_hash(measurements)
        date = version_date or dt.date.today().isoformat()
        self.version_ = f"{date}-{self.data_hash_[:8]}"
        self.n_rows_ = len(measurements)
        return self

    @property
    def method(self) -> str:
        check_is_fitted(self, ["version_"])
        return f"learned:{self.version_}"

    def with_coverage(self, coverage: float) -> LearnedPredictor:
        """The same models with upper bounds re-calibrated to ``coverage`` (e.g. 0.99)."""
        check_is_fitted(self, ["conformal_"])
        other = LearnedPredictor(coverage, self.n_splits, self.params, self.base)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k.endswith("_")})
        other.conformal_ = {
            m: ConformalUpper.from_state(c.state(), coverage) for m, c in self.conformal_.items()
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
        tensors = table.peak_vram_gib - table.breakdown_gib["overhead"]
        base = {
            "peak_vram_gib": tensors,
            "step_time_s": table.step_time_s,
            "ttft_s": table.ttft_s,
            "tpot_s": table.tpot_s,
        }
        out: dict[str, np.ndarray] = {}
        X_cache: np.ndarray | None = None
        for metric in LEARNED_METRICS:
            model = self.models_.get(metric)
            b = base[metric]
            if model is None or n == 0:
                out[metric] = np.zeros((n, g))
                continue
            valid = np.isfinite(b) & (b > 0)
            if X_cache is None:
                X_cache = feature_matrix(specs, table, rows, cols, np.ones(n * g))
            X = X_cache.copy()
            X[:, -1] = np.log(np.where(valid, b, 1.0).reshape(-1))
            corr = model.predict(X).reshape(n, g)
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
        fams = [task_family(s.task.value) for s in specs]
        ovh = t.breakdown_gib["overhead"]
        tensors = t.peak_vram_gib - ovh
        scale = np.exp(c["peak_vram_gib"])
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
            method=(self.method,) * len(specs),
        )


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
) -> CVResult:
    """Grouped CV by source of the whole learned tier, upper bounds included.

    For each outer fold the corrections are fitted on the other sources, and the conformal
    bound is calibrated on *inner* out-of-fold scores of those sources only, so coverage is
    measured on data that neither the model nor its calibration saw.
    """
    from sklearn.model_selection import GroupKFold

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
        n_groups = len(set(d.groups.tolist()))
        if d.y.size < 8 or n_groups < 2:
            fallback[metric] = f"{d.y.size} rows from {n_groups} source(s): analytical only"
            continue
        oof = np.zeros(d.y.size)
        q = np.zeros(d.y.size)
        analytical_q = np.zeros(d.y.size)
        for tr, te in GroupKFold(n_splits=min(n_splits, n_groups)).split(d.X, d.y, d.groups):
            model = ResidualRegressor(params=params).fit(d.X[tr], d.y[tr])
            oof[te] = model.predict(d.X[te])
            inner = _oof(d.X[tr], d.y[tr], d.groups[tr], 3, params)
            conf = ConformalUpper(coverage).fit(d.y[tr] - inner, d.families[tr].tolist())
            q[te] = conf.log_margin(d.families[te].tolist())
            conf_a = ConformalUpper(coverage).fit(d.y[tr], d.families[tr].tolist())
            analytical_q[te] = conf_a.log_margin(d.families[te].tolist())
        measured = d.base * np.exp(d.y)
        a = summarise(measured, d.base, d.base)
        lrn = summarise(measured, d.base * np.exp(oof), d.base * np.exp(oof))
        comparison[metric] = {"analytical_mape": a.mape, "learned_mape": lrn.mape}
        if lrn.mape < a.mape:
            point[metric][d.idx] = d.base * np.exp(oof)
            upper[metric][d.idx] = d.base * np.exp(oof + q)
        else:
            fallback[metric] = (
                f"grouped CV MAPE {lrn.mape:.1%} ≥ analytical {a.mape:.1%}: falls back"
            )
            point[metric][d.idx] = d.base
            upper[metric][d.idx] = d.base * np.exp(analytical_q)
    # runtime_s is not learned directly; the learned tier's runtime follows its step/TTFT/TPOT.
    learned_pv = PredictedValues(point, upper, pv.gpu_column, pv.unexpressed)
    report = evaluate(measurements, learned_pv, tier="learned")
    report.notes.append("grouped CV by source; conformal bounds from inner CV of training folds")
    report.notes.extend(f"{m}: {why}" for m, why in fallback.items())
    return CVResult(
        report=report,
        analytical=evaluate(measurements, pv, tier="analytical"),
        comparison=comparison,
        fallback=fallback,
    )
