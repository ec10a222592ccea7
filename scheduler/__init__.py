"""snugfit scheduler: pool model, placement policies, simulator, the service and its client.

Names resolve lazily (PEP 562) so that ``snugfit predict`` and other light commands do not
import Redis, RQ, HiGHS or the simulator just because they live in this package.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

# public name -> defining module
_EXPORTS: dict[str, str] = {
    # pool and placement core
    "Pool": "scheduler.core.pool",
    "PoolState": "scheduler.core.state",
    "load_pool": "scheduler.core.pool",
    "synthetic_pool": "scheduler.core.synthetic",
    "PlacementRequest": "scheduler.core.requests",
    "RunningJob": "scheduler.core.requests",
    "enumerate_options": "scheduler.core.options",
    "fits_anywhere": "scheduler.core.options",
    "Decision": "scheduler.core.decision",
    "Option": "scheduler.core.decision",
    "SchedulerCore": "scheduler.core.loop",
    "Clock": "scheduler.core.clock",
    "SystemClock": "scheduler.core.clock",
    "VirtualClock": "scheduler.core.clock",
    "Policy": "scheduler.policies.base",
    "GreedyPolicy": "scheduler.policies.greedy",
    "PolicyName": "scheduler.policies.registry",
    "get_policy": "scheduler.policies.registry",
    # simulation
    "Simulator": "scheduler.sim.simulator",
    "SimulationResult": "scheduler.sim.simulator",
    "simulate": "scheduler.sim.simulator",
    "SimulationMetrics": "scheduler.sim.outcomes",
    "compute_metrics": "scheduler.sim.outcomes",
    "ResidualModel": "scheduler.sim.truth",
    "load_residuals": "scheduler.sim.truth",
    "Workload": "scheduler.sim.workload",
    "generate_workload": "scheduler.sim.workload",
    "replay_seeds": "scheduler.sim.openb.replay",
    # service
    "Client": "scheduler.service.client",
    "JobHandle": "scheduler.service.client",
    "SchedulerService": "scheduler.service.leader",
    "connect": "scheduler.service.store.embedded",
    "Store": "scheduler.service.store.protocol",
    "RedisStore": "scheduler.service.store.redis_store",
    "Keys": "scheduler.service.store.keys",
    "JobState": "scheduler.service.store.keys",
    # operators
    "Telemetry": "scheduler.service.telemetry",
    "start_metrics_server": "scheduler.service.telemetry",
    "write_report": "scheduler.cli.report",
    "run_demo": "scheduler.cli.demo.run",
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
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
