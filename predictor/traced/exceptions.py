"""Errors of the traced tier, under the predictor's root error."""

from __future__ import annotations

from ..exceptions import PredictorError

__all__ = ["TraceError", "TraceTimeout", "TraceUnavailable", "TraceUnsupported"]


class TraceError(PredictorError):
    """A trace failed; the analytical tier answers and the failure is recorded."""


class TraceUnsupported(TraceError):
    """The job runs code the tracer does not model (a serving engine, torch.compile, ...)."""


class TraceUnavailable(TraceError):
    """torch / transformers / peft are not installed (``pip install 'snugfit[trace]'``)."""


class TraceTimeout(TraceError):
    """A trace ran past its time limit."""
