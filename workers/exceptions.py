"""Errors raised on GPU nodes: the worker, job execution and the profiling harness.

All derive from :class:`WorkerError`. The ``ValueError`` bases keep callers that caught the
built-in working.
"""

from __future__ import annotations

__all__ = ["NvmlError", "ProfileError", "WorkerError"]


class WorkerError(Exception):
    """Root of every error the workers package raises."""


class ProfileError(WorkerError, ValueError):
    """A profiling sweep was misconfigured (device, timeout, duplicate job ids, ...)."""


class NvmlError(WorkerError, ValueError):
    """The NVML sampler was misconfigured."""
