"""``snugfit demo``: the whole service on one machine, live against the simulated baseline."""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "DEMO_POOL": "scheduler.cli.demo.run",
    "DemoConfig": "scheduler.cli.demo.run",
    "DemoResult": "scheduler.cli.demo.run",
    "run_demo": "scheduler.cli.demo.run",
    "live_metrics": "scheduler.cli.demo.live",
    "ProcessGroup": "scheduler.cli.demo.processes",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
