"""The learned tier's estimator: LightGBM on a log-ratio target, scikit-learn style."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._learned_features import FEATURE_NAMES
from .exceptions import DataError, NotFittedError

__all__ = [
    "DEFAULT_PARAMS",
    "DEFAULT_ROUNDS",
    "MAX_LOG_CORRECTION",
    "ResidualRegressor",
    "check_is_fitted",
]

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


def check_is_fitted(estimator: object, attributes: Sequence[str]) -> None:
    """scikit-learn's idiom with this package's error type."""
    missing = [a for a in attributes if not hasattr(estimator, a)]
    if missing:
        raise NotFittedError(
            f"{type(estimator).__name__} is not fitted (missing {', '.join(missing)}); "
            "call fit() or load a trained artifact first"
        )


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
        lgb = _lightgbm_for_predicting()
        est = cls()
        est.booster_ = lgb.Booster(model_str=text)
        est.n_features_in_ = est.booster_.num_feature()
        return est


def _lightgbm_for_predicting() -> Any:
    """lightgbm for loading and running a booster, without importing scikit-learn.

    lightgbm imports scikit-learn (most of its import time) for its sklearn
    wrappers, which predicting never uses; when nothing has imported scikit-learn yet, hide
    it for the duration of that import. Training imports both normally afterwards.
    """
    import sys

    if "lightgbm" in sys.modules or "sklearn" in sys.modules:
        import lightgbm

        return lightgbm
    sys.modules["sklearn"] = None  # type: ignore[assignment]
    try:
        import lightgbm
    finally:
        del sys.modules["sklearn"]
    return lightgbm
