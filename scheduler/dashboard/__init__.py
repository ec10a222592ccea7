"""The read-only web dashboard: the pool, the queue with pending reasons, each job's
``explain`` view, the live placement log and cost over time, from the same Redis the
scheduler and workers use.

:func:`create_app` builds the Starlette application over a store; :mod:`.server` serves it
with uvicorn (``snugfit dashboard``, ``snugfit scheduler --dashboard``, ``snugfit demo``).
The page data are plain functions of the store (``*_view``, :mod:`.usage`), also served as
JSON under ``/api/``. Like ``cli/`` it is an edge (people read it), so it reuses the CLI's
rendering helpers (:mod:`scheduler.cli.render`) and nothing below imports it.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "DashboardConfig": "scheduler.dashboard.app",
    "create_app": "scheduler.dashboard.app",
    "DEFAULT_HOST": "scheduler.dashboard.server",
    "DEFAULT_PORT": "scheduler.dashboard.server",
    "RunningDashboard": "scheduler.dashboard.server",
    "start_in_thread": "scheduler.dashboard.server",
    "pool_data": "scheduler.dashboard.pool_view",
    "queue_data": "scheduler.dashboard.queue_view",
    "job_data": "scheduler.dashboard.job_view",
    "UsageTail": "scheduler.dashboard.usage",
    "usage_series": "scheduler.dashboard.usage",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
