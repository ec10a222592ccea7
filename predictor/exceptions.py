"""Errors raised by the predictor. Every error derives from :class:`PredictorError`.

Messages follow one rule: say what was wrong, the value received, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "DataError",
    "NotFittedError",
    "PredictorError",
    "SpecError",
    "UnknownGpuError",
    "UnknownModelError",
    "UnmappedArchError",
]


class PredictorError(Exception):
    """Root of every error the predictor raises."""


class SpecError(PredictorError, ValueError):
    """A job spec is invalid (unknown field, impossible combination, bad size)."""


class UnknownModelError(SpecError):
    """A model name is not in the catalogue and is not a readable config.json."""


class UnknownGpuError(SpecError):
    """A GPU type name is not in the catalogue."""


class DataError(PredictorError, ValueError):
    """A measurement row or dataset file cannot be used."""


class NotFittedError(PredictorError, RuntimeError):
    """An estimator was used before ``fit``."""


class ArtifactError(PredictorError):
    """A trained model artifact is missing, corrupt or from an incompatible version."""


class UnmappedArchError(PredictorError, ValueError):
    """No Hugging Face class reproduces a model architecture (the traced tier and the profiler
    build models through HF)."""
