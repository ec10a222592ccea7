"""Versioned, pickle-free artifacts of the learned tier.

One JSON file holds everything: LightGBM boosters in their own text format (strings), the
conformal calibration scores, the feature list, the grouped-CV metrics, the training-data hash,
the date and a format version. Loading parses JSON and hands model strings to LightGBM's text
parser, so a tampered artifact can at worst give wrong numbers, never run code.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from ._paths import datasets_dir
from .conformal import DEFAULT_COVERAGE, RUNTIME_COVERAGE, ConformalUpper
from .exceptions import ArtifactError
from .learned import (
    FEATURE_NAMES,
    LearnedPredictor,
    ResidualRegressor,
    check_is_fitted,
    metric_coverage,
)

__all__ = [
    "ARTIFACT_FORMAT",
    "ARTIFACT_FORMAT_VERSION",
    "active_artifact_path",
    "default_artifact_path",
    "home_artifact_path",
    "load_artifact",
    "save_artifact",
]

ARTIFACT_FORMAT = "snugfit-learned"
ARTIFACT_FORMAT_VERSION = 2


def default_artifact_path() -> Path:
    """The artifact shipped with the package (``datasets/artifacts/learned.json``)."""
    return datasets_dir() / "artifacts" / "learned.json"


def home_artifact_path() -> Path:
    """Where ``snugfit train`` and the leader's retraining write: ``$SNUGFIT_HOME/artifacts/
    learned.json`` (``~/.cache/snugfit`` without the variable, as the trace cache)."""
    home = os.environ.get("SNUGFIT_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "snugfit"
    return base / "artifacts" / "learned.json"


def active_artifact_path() -> Path:
    """The artifact predictions use: the trained one under ``$SNUGFIT_HOME`` when there is
    one, else the shipped one. So a retrained artifact reaches every client and the leader
    that share the home, while the shipped file changes only by release."""
    home = home_artifact_path()
    return home if home.is_file() else default_artifact_path()


def save_artifact(model: LearnedPredictor, path: str | Path | None = None) -> Path:
    """Write ``model`` as one JSON file; returns the path written."""
    check_is_fitted(model, ["models_", "conformal_", "version_"])
    out = Path(path) if path else default_artifact_path()
    metrics: dict[str, Any] = {}
    for metric, est in model.models_.items():
        conf = model.conformal_.get(metric)
        metrics[metric] = {
            "enabled": est is not None and bool(model.shrink_.get(metric, 0.0)),
            "shrink": model.shrink_.get(metric, 0.0),
            "booster": est.booster_.model_to_string() if est is not None else None,
            "fallback": model.fallback_.get(metric),
            "conformal": conf.state() if conf is not None else None,
            "cv": model.cv_.get(metric),
        }
    doc = {
        "format": ARTIFACT_FORMAT,
        "format_version": ARTIFACT_FORMAT_VERSION,
        "version": model.version_,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "training_data_hash": model.data_hash_,
        "n_training_rows": model.n_rows_,
        "feature_names": list(FEATURE_NAMES),
        "coverage": model.coverage,
        "runtime_coverage": model.runtime_coverage,
        "method": model.method,
        "params": model.params,
        "metrics": metrics,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    tmp.replace(out)
    return out


def load_artifact(
    path: str | Path | None = None,
    coverage: float | None = None,
    runtime_coverage: float | None = None,
) -> LearnedPredictor:
    """Read an artifact; ``coverage`` re-calibrates the upper bounds (e.g. 0.99 to reserve).

    ``coverage`` alone sets both the VRAM and the time bounds (a reservation wants both);
    neither keeps the artifact's documented targets.
    """
    p = Path(path) if path else active_artifact_path()
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(
            f"no learned-tier artifact at {str(p)!r}; run `snugfit train` to create one"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"artifact {str(p)!r} is not readable JSON ({exc}); retrain") from None
    if not isinstance(doc, dict) or doc.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{str(p)!r} is not a {ARTIFACT_FORMAT} artifact; retrain")
    if doc.get("format_version") != ARTIFACT_FORMAT_VERSION:
        raise ArtifactError(
            f"artifact {str(p)!r} has format version {doc.get('format_version')!r}; this snugfit "
            f"reads version {ARTIFACT_FORMAT_VERSION}. Retrain with `snugfit train`"
        )
    if list(doc.get("feature_names", [])) != list(FEATURE_NAMES):
        raise ArtifactError(
            f"artifact {str(p)!r} was trained on different features; retrain with `snugfit train`"
        )
    cov = coverage if coverage is not None else float(doc.get("coverage", DEFAULT_COVERAGE))
    if runtime_coverage is not None:
        rt = runtime_coverage
    elif coverage is not None:
        rt = coverage
    else:
        rt = float(doc.get("runtime_coverage", RUNTIME_COVERAGE))
    model = LearnedPredictor(coverage=cov, params=doc.get("params"), runtime_coverage=rt)
    model.models_ = {}
    model.shrink_ = {}
    model.conformal_ = {}
    model.cv_ = {}
    model.fallback_ = {}
    try:
        for metric, entry in doc["metrics"].items():
            text = entry.get("booster")
            model.models_[metric] = (
                ResidualRegressor.from_model_string(text) if entry.get("enabled") and text else None
            )
            model.shrink_[metric] = float(entry.get("shrink") or 0.0)
            if entry.get("conformal"):
                model.conformal_[metric] = ConformalUpper.from_state(
                    entry["conformal"], metric_coverage(metric, cov, rt)
                )
            if entry.get("cv"):
                model.cv_[metric] = dict(entry["cv"])
            if entry.get("fallback"):
                model.fallback_[metric] = str(entry["fallback"])
        model.version_ = str(doc["version"])
        model.data_hash_ = str(doc["training_data_hash"])
        model.n_rows_ = int(doc["n_training_rows"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"artifact {str(p)!r} is incomplete ({exc!r}); retrain") from None
    except Exception as exc:  # LightGBM raises its own error type on a corrupt model string
        raise ArtifactError(f"artifact {str(p)!r} has a corrupt model ({exc}); retrain") from None
    return model
