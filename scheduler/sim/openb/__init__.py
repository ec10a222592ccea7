"""The Alibaba GPU v2023 "openb" trace replayed under the FGD paper's protocol."""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "DEFAULT_NODES_CSV": "scheduler.sim.openb.trace",
    "DEFAULT_PODS_CSV": "scheduler.sim.openb.trace",
    "OpenbCluster": "scheduler.sim.openb.trace",
    "OpenbWorkload": "scheduler.sim.openb.trace",
    "load_nodes": "scheduler.sim.openb.trace",
    "load_pods": "scheduler.sim.openb.trace",
    "OpenbPolicy": "scheduler.sim.openb.replay",
    "OpenbResult": "scheduler.sim.openb.replay",
    "replay_seeds": "scheduler.sim.openb.replay",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
