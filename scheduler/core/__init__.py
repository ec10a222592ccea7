"""The pure placement core: requests, decisions, the pool and its state, enumerate + price,
decide, backfill, the loop and the clock. In memory, numpy-vectorised, no I/O; the live service
and the simulator both drive it.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "HABITUAL_GPU": "scheduler.core.requests",
    "PlacementRequest": "scheduler.core.requests",
    "RunningJob": "scheduler.core.requests",
    "requested_type": "scheduler.core.requests",
    "Decision": "scheduler.core.decision",
    "Option": "scheduler.core.decision",
    "Node": "scheduler.core.pool",
    "NodeConfig": "scheduler.core.pool",
    "Pool": "scheduler.core.pool",
    "PoolConfig": "scheduler.core.pool",
    "load_pool": "scheduler.core.pool",
    "synthetic_pool": "scheduler.core.synthetic",
    "PoolState": "scheduler.core.state",
    "Summary": "scheduler.core.state",
    "TypeFree": "scheduler.core.state",
    "OptionBatch": "scheduler.core.options",
    "enumerate_options": "scheduler.core.options",
    "fits_anywhere": "scheduler.core.options",
    "fits_anywhere_many": "scheduler.core.options",
    "option_table": "scheduler.core.options",
    "OptionTable": "scheduler.core.table",
    "Binding": "scheduler.core.binding",
    "cheapest_index": "scheduler.core.decide",
    "pending_decision": "scheduler.core.decide",
    "pending_from_batch": "scheduler.core.decide",
    "place": "scheduler.core.decide",
    "rejected_decision": "scheduler.core.decide",
    "earliest_fit": "scheduler.core.backfill",
    "CoreCounters": "scheduler.core.loop",
    "SchedulerCore": "scheduler.core.loop",
    "RequestHistory": "scheduler.core.history",
    "history_method": "scheduler.core.history",
    "MAX_OOM_RETRIES": "scheduler.core.rules",
    "MAX_RETRIES": "scheduler.core.rules",
    "OOM_GROWTH": "scheduler.core.rules",
    "memory_limit_gib": "scheduler.core.rules",
    "requeue_reservation_gib": "scheduler.core.rules",
    "Escalation": "scheduler.core.escalation",
    "TensorParallelRetry": "scheduler.core.escalation",
    "escalate_oom": "scheduler.core.escalation",
    "Clock": "scheduler.core.clock",
    "SystemClock": "scheduler.core.clock",
    "VirtualClock": "scheduler.core.clock",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
