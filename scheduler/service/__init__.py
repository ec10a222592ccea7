"""The service on Redis + RQ: the leader, the placement-log events (shared with the workers),
the Python client, the queue and accounting views, Prometheus telemetry; ``store/`` holds
Redis itself.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "SchedulerService": "scheduler.service.leader",
    "StepStats": "scheduler.service.leader",
    "HistoryFeed": "scheduler.service.history_feed",
    "EventLog": "scheduler.service.events",
    "event": "scheduler.service.events",
    "Client": "scheduler.service.client",
    "JobHandle": "scheduler.service.client",
    "Deployments": "scheduler.service.deployments",
    "DeploymentHandle": "scheduler.service.deployments",
    "QueueRow": "scheduler.service.queue",
    "queue_rows": "scheduler.service.queue",
    "accounting": "scheduler.service.accounting",
    "parse_when": "scheduler.service.accounting",
    "Telemetry": "scheduler.service.telemetry",
    "start_metrics_server": "scheduler.service.telemetry",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
