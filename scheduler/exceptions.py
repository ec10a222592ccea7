"""Errors raised by the scheduler, client and service. All derive from :class:`SchedulerError`."""

from __future__ import annotations

__all__ = [
    "JobFailedError",
    "JobNotFoundError",
    "PlacementError",
    "PolicyError",
    "PoolError",
    "SchedulerError",
    "ServiceError",
    "SimulationError",
    "TraceError",
    "UnknownDependencyError",
]


class SchedulerError(Exception):
    """Root of every error the scheduler package raises."""


class PoolError(SchedulerError, ValueError):
    """A pool file or pool operation is invalid (unknown GPU type, bad MIG layout, ...)."""


class PlacementError(SchedulerError):
    """A placement could not be committed (capacity taken meanwhile, unknown option)."""


class PolicyError(SchedulerError, ValueError):
    """Unknown policy or bad policy option."""


class SimulationError(SchedulerError):
    """The simulator was given an inconsistent workload or pool."""


class TraceError(SchedulerError, ValueError):
    """A cluster trace file is missing or malformed."""


class ServiceError(SchedulerError):
    """The Redis-backed service failed (connection, lease, corrupt record)."""


class JobNotFoundError(ServiceError, KeyError):
    """No job with that id exists."""


class JobFailedError(ServiceError):
    """A job ended in failure; ``wait()`` re-raises it with the reason."""


class UnknownDependencyError(ServiceError, ValueError):
    """A job's ``depends_on`` names a job id that does not exist; nothing was submitted."""
