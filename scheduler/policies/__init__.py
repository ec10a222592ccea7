"""Placement policies, one per file, looked up by :class:`PolicyName` through
:func:`get_policy`. Greedy ones subclass :class:`GreedyPolicy`.
"""

from __future__ import annotations

from scheduler._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Policy": "scheduler.policies.base",
    "Tick": "scheduler.policies.base",
    "GreedyPolicy": "scheduler.policies.greedy",
    "PolicyName": "scheduler.policies.registry",
    "get_policy": "scheduler.policies.registry",
    "RightSizePolicy": "scheduler.policies.rightsize",
    "RequestedPolicy": "scheduler.policies.requested",
    "FirstFitPolicy": "scheduler.policies.firstfit",
    "BestFitPolicy": "scheduler.policies.bestfit",
    "EasyBackfillPolicy": "scheduler.policies.easy_backfill",
    "FgdPolicy": "scheduler.policies.fgd",
    "OptimalPolicy": "scheduler.policies.optimal",
    "NodeScorePolicy": "scheduler.policies.node_score",
    "FgdNodePolicy": "scheduler.policies.node_score",
    "FgdStrandPolicy": "scheduler.policies.node_score",
    "LookaheadPolicy": "scheduler.policies.lookahead",
    "BestFitNodePolicy": "scheduler.policies.node_score",
    "DotProductPolicy": "scheduler.policies.node_score",
    "GpuPackingPolicy": "scheduler.policies.node_score",
    "GpuClusteringPolicy": "scheduler.policies.node_score",
    "RandomNodePolicy": "scheduler.policies.node_score",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
