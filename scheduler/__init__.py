"""snugfit scheduler: pool model, placement policies, simulator, the service and its client.

Names resolve lazily (PEP 562) so that ``snugfit predict`` and other light commands do not
import Redis, RQ, HiGHS or the simulator just because they live in this package.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> defining module
_EXPORTS: dict[str, str] = {
    # pool and placement core
    "Pool": "scheduler.pool",
    "PoolState": "scheduler.pool",
    "load_pool": "scheduler.pool",
    "synthetic_pool": "scheduler.pool",
    "PlacementRequest": "scheduler.placement",
    "RunningJob": "scheduler.placement",
    "enumerate_options": "scheduler.placement",
    "fits_anywhere": "scheduler.placement",
    "Decision": "scheduler.decision",
    "Option": "scheduler.decision",
    "Clock": "scheduler.clock",
    "SystemClock": "scheduler.clock",
    "VirtualClock": "scheduler.clock",
    "Policy": "scheduler.policies.base",
    "PolicyName": "scheduler.policies.registry",
    "get_policy": "scheduler.policies.registry",
    # simulation
    "Simulator": "scheduler.simulator",
    "SimulationResult": "scheduler.simulator",
    "simulate": "scheduler.simulator",
    "SimulationMetrics": "scheduler.metrics",
    "compute_metrics": "scheduler.metrics",
    "ResidualModel": "scheduler.truth",
    "load_residuals": "scheduler.truth",
    "Workload": "scheduler.workload",
    "generate_workload": "scheduler.workload",
    "replay_seeds": "scheduler.openb",
    # service
    "Client": "scheduler.client",
    "JobHandle": "scheduler.client",
    "SchedulerService": "scheduler.service",
    "connect": "scheduler.connection",
    "Store": "scheduler.connection",
    "RedisStore": "scheduler.connection",
    "MemoryStore": "scheduler.connection",
    "Keys": "scheduler.keys",
    "JobState": "scheduler.keys",
    # operators
    "Telemetry": "scheduler.telemetry",
    "start_metrics_server": "scheduler.telemetry",
    "write_report": "scheduler.report",
    "run_demo": "scheduler.demo",
    # errors
    "SchedulerError": "scheduler.exceptions",
    "PoolError": "scheduler.exceptions",
    "PlacementError": "scheduler.exceptions",
    "PolicyError": "scheduler.exceptions",
    "SimulationError": "scheduler.exceptions",
    "TraceError": "scheduler.exceptions",
    "ServiceError": "scheduler.exceptions",
    "JobNotFoundError": "scheduler.exceptions",
    "JobFailedError": "scheduler.exceptions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
