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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._jobarrays import FRAMEWORKS, TASKS, job_arrays
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
from .exceptions import DataError, NotFittedError
from .gpus import GPU_NAMES, get_gpu
from .measurements import Measurement, calibration_exclusion, is_quirk
from .prediction import PredictionTable
from .spec import JobSpec, Task

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

#: Metrics the learned tier corrects; ``runtime_s`` is derived from them.
LEARNED_METRICS: tuple[str, ...] = ("peak_vram_gib", "step_time_s", "ttft_s", "tpot_s")

# A handful of physically meaningful features: with a dozen sources per metric, every extra
# column is another way to memorise a source instead of learning a setup.
_FW_FAMILY: dict[str, str] = {
    "hf": "hf",
    "peft": "hf",
    "unsloth": "hf",
    "deepspeed": "hf",
    "torchtune": "torchtune",
    "vllm": "serving",
    "sglang": "serving",
    "trtllm": "trtllm",
    "megatron": "megatron",
    "fsdp": "fsdp",
    "other": "other",
}
_FW_FAMILIES: tuple[str, ...] = (
    "hf",
    "torchtune",
    "serving",
    "trtllm",
    "megatron",
    "fsdp",
    "other",
)
_KINDS: tuple[str, ...] = ("allocated", "reserved", "nvml_used", "unknown")
_SHARE_KEYS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "kv_cache",
    "logits",
)
FEATURE_NAMES: tuple[str, ...] = (
    "task_inference",
    "task_full",
    "task_lora",
    "task_qlora",
    *(f"fw_{f}" for f in _FW_FAMILIES),
    *(f"kind_{k}" for k in _KINDS),
    "log_total_params_b",
    "is_moe",
    "weight_quantised",
    "fp8_compute",
    *(f"share_{k}" for k in _SHARE_KEYS),
    "log_tokens_per_gpu",
    "log_n_gpus",
    "log_tp",
    "log_hbm_bandwidth_gbps",
    "checkpointing",
    "base_traced",
)
#: Measurement kind the corrections predict for: the learned VRAM correction applies to the
#: tensor part of the peak (``peak − overhead``), which is what ``allocated`` counts.
PREDICT_KIND = "allocated"

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "huber",
    "alpha": 0.3,
    "learning_rate": 0.05,
    "num_leaves": 4,
    "max_depth": 2,
    "min_data_in_leaf": 20,
    "lambda_l2": 10.0,
    "min_data_in_bin": 1,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "seed": 7,
}
DEFAULT_ROUNDS = 100
#: Largest correction, as a log factor (×/÷ 3): outside the data the trees extrapolate flat,
#: and a bounded factor keeps a wild fold from overriding the physics.
MAX_LOG_CORRECTION = float(np.log(3.0))
#: Shrinkage factors tried for each metric's correction (0 = analytical, 1 = full correction).
SHRINK_GRID: tuple[float, ...] = tuple(float(x) for x in np.linspace(0.0, 1.0, 11))


def check_is_fitted(estimator: object, attributes: Sequence[str]) -> None:
    """scikit-learn's idiom with this package's error type."""
    missing = [a for a in attributes if not hasattr(estimator, a)]
    if missing:
        raise NotFittedError(
            f"{type(estimator).__name__} is not fitted (missing {', '.join(missing)}); "
            "call fit() or load a trained artifact first"
        )


def _monotone(metric: str) -> list[int]:
    # More tokens per GPU never need less memory, so the tensor correction may not fall with
    # them. Time ratios legitimately fall with work (fixed per-step costs amortise), so the
    # time corrections stay unconstrained.
    up = {"log_tokens_per_gpu"} if metric == "peak_vram_gib" else set()
    return [1 if f in up else 0 for f in FEATURE_NAMES]


# ------------------------------------------------------------------------------ features
def feature_matrix(
    specs: Sequence[JobSpec],
    table: PredictionTable,
    rows: np.ndarray,
    cols: np.ndarray,
    metric: str,
    kinds: Sequence[str] | None = None,
) -> np.ndarray:
    """Features for (job ``rows[k]``, GPU column ``cols[k]``) pairs; shape ``(k, n_features)``.

    ``kinds`` is the VRAM measurement kind per pair (training rows); predictions use
    :data:`PREDICT_KIND`.
    """
    j = job_arrays(specs)
    rows = np.asarray(rows, dtype=int)
    cols = np.asarray(cols, dtype=int)
    t = j.task[rows]
    task = [t == TASKS.index(Task.INFERENCE)]
    task.append((t == TASKS.index(Task.FULL_FINETUNE)) | (t == TASKS.index(Task.PRETRAIN)))
    task += [t == TASKS.index(Task.LORA), t == TASKS.index(Task.QLORA)]
    fam = np.array([_FW_FAMILY[FRAMEWORKS[int(k)].value] for k in j.framework[rows]])
    fw = [fam == f for f in _FW_FAMILIES]
    kind_arr = np.array(list(kinds) if kinds is not None else [PREDICT_KIND] * rows.size)
    kind = [kind_arr == k for k in _KINDS]
    peak = np.maximum(table.peak_vram_gib[rows, cols], 1e-9)
    # Memory shares explain memory errors; for time they only let trees memorise sources.
    use_shares = metric == "peak_vram_gib"
    shares = [
        table.breakdown_gib[k][rows, cols] / peak if use_shares else np.zeros(rows.size)
        for k in _SHARE_KEYS
    ]
    is_inf = t == TASKS.index(Task.INFERENCE)
    seq = np.where(is_inf, j.input_len[rows], j.seq_len[rows])
    # A decode step processes one token per sequence; everything else a whole sequence.
    tokens = j.batch[rows] * (1.0 if metric == "tpot_s" else np.maximum(seq, 1.0))
    bw = np.log([get_gpu(g).hbm_bandwidth_gbps for g in table.gpu_names])[cols]
    cols_out = [
        *task,
        *fw,
        *kind,
        np.log(j.total_params[rows] / 1e9),
        j.is_moe[rows],
        j.weight_is_quantised[rows],
        j.compute_bytes[rows] <= 1.0,
        *shares,
        np.log(np.maximum(tokens, 1.0)),
        np.log(j.n_gpus[rows]),
        np.log(j.tp[rows]),
        bw,
        j.checkpointing[rows],
        np.array([_is_traced(table.method[int(r)]) for r in rows], dtype=float),
    ]
    return np.column_stack(cols_out).astype(np.float64)


def _is_traced(method: str) -> bool:
    """Whether a base table's row came from the traced tier (its own conformal group)."""
    return method.startswith("traced")


def _traced_method(method: str) -> str:
    """``traced+learned:<ver>`` / ``traced+conformal:<ver>`` for a row on a traced base."""
    return "traced+" + method.removeprefix("analytical+")


# ------------------------------------------------------------------------------ estimator
@dataclass
class ResidualRegressor:
    """LightGBM on a log-ratio target, scikit-learn style (``fit`` returns self)."""

    params: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    num_rounds: int = DEFAULT_ROUNDS
    feature_names: Sequence[str] = FEATURE_NAMES
    monotone: Sequence[int] | None = None

    def _lgb_params(self, n: int) -> dict[str, Any]:
        p = dict(self.params)
        # Never ask for leaves larger than a third of the data: with 20 rows that is one split.
        p["min_data_in_leaf"] = int(min(p.get("min_data_in_leaf", 20), max(2, n // 3)))
        if self.monotone is not None:
            p["monotone_constraints"] = list(self.monotone)
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
        names = list(self.feature_names)
        if len(names) != X.shape[1]:
            names = [f"f{i}" for i in range(X.shape[1])]
            self.monotone = None
        ds = lgb.Dataset(X, label=y, feature_name=names, free_raw_data=True)
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


def training_data_hash(measurements: Sequence[Measurement]) -> str:
    """SHA-256 of the canonical JSON of every training row (order-independent)."""
    lines = sorted(json.dumps(m.to_row(), sort_keys=True) for m in measurements)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def metric_coverage(metric: str, vram_coverage: float, runtime_coverage: float) -> float:
    return vram_coverage if metric == "peak_vram_gib" else runtime_coverage


def _conformal(metric: str, coverage: float) -> ConformalUpper:
    # Task families separate memory errors (inference ≪ training), but not time errors, which
    # follow the source's stack; grouped CV finds pooled time bounds narrower at equal coverage.
    min_scores = MIN_FAMILY_SCORES if metric == "peak_vram_gib" else _POOLED
    return ConformalUpper(coverage, min_scores=min_scores)


_POOLED = 1_000_000_000


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
            folds = _nested(d, self.n_splits, self.params, metric)
            corr = np.zeros(d.y.size)
            for f in folds:
                corr[f.test] = f.correction
            measured = d.base * np.exp(d.y)
            a = summarise(measured, d.base, d.base)
            lrn = summarise(measured, d.base * np.exp(corr), d.base * np.exp(corr))
            mono = _monotone(metric)
            oof = _oof(d.X, d.y, d.groups, self.n_splits, self.params, mono, d.train)
            lam = _choose_shrink(d.y[d.train], oof[d.train])
            self.cv_[metric] = {
                "n": float(d.y.size),
                "n_groups": float(len(set(d.groups.tolist()))),
                "analytical_mape": a.mape,
                "learned_mape": lrn.mape,
                "analytical_median_ape": a.median_ape,
                "learned_median_ape": lrn.median_ape,
                "shrink": lam,
                "fold_shrinks": float(np.mean([f.shrink for f in folds])),
            }
            scores = d.y
            if lrn.mape < a.mape and lam > 0:
                self.models_[metric] = ResidualRegressor(params=self.params, monotone=mono).fit(
                    d.X[d.train], d.y[d.train]
                )
                self.shrink_[metric] = lam
                scores = d.y - lam * oof
            else:
                self.fallback_[metric] = (
                    f"nested grouped-CV MAPE {lrn.mape:.1%} is not better than analytical "
                    f"{a.mape:.1%}; analytical used"
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
        folds = _nested(d, n_splits, params, metric)
        corr = np.zeros(d.y.size)
        q = np.zeros(d.y.size)
        analytical_q = np.zeros(d.y.size)
        for f in folds:
            corr[f.test] = f.correction
            fams_te = d.families[f.test].tolist()
            conf = _conformal(metric, cov).fit(f.scores, f.families.tolist())
            q[f.test] = conf.log_margin(fams_te)
            analytical_q[f.test] = (
                _conformal(metric, cov).fit(f.raw_scores, f.families.tolist()).log_margin(fams_te)
            )
        measured = d.base * np.exp(d.y)
        a = summarise(measured, d.base, d.base)
        lrn = summarise(measured, d.base * np.exp(corr), d.base * np.exp(corr))
        comparison[metric] = {
            "analytical_mape": a.mape,
            "learned_mape": lrn.mape,
            "analytical_median_ape": a.median_ape,
            "learned_median_ape": lrn.median_ape,
        }
        if lrn.mape < a.mape:
            point[metric][d.idx] = d.base * np.exp(corr)
            upper[metric][d.idx] = d.base * np.exp(corr + q)
        else:
            fallback[metric] = (
                f"nested grouped-CV MAPE {lrn.mape:.1%} ≥ analytical {a.mape:.1%}: falls back"
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
