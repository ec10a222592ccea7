"""Serving by SLO: choose the GPU type, TP, precision, batch and replicas of an LLM deployment
that meet its latency targets at the lowest cost per million tokens.

``plan(spec)`` takes a ``task: serve`` JobSpec and returns a :class:`ServingPlan` (every option
with its numbers and the reason it lost); ``ServingPlan.to_contract()`` is the
``snugfit plan --json`` object. The performance maths sits behind ``_perf`` (see its docstring).
"""

from ._engines import ENGINE_PLACEHOLDERS
from ._slo import SloTier, default_slo
from .frontier import FrontierPoint, frontier, plan_frontiers
from .planner import (
    CONTRACT_OPTION_KEYS,
    EXTRA_OPTION_KEYS,
    PlanOption,
    ServingPlan,
    plan,
    plan_many,
)
from .replica import replica_throughput

__all__ = [
    "CONTRACT_OPTION_KEYS",
    "ENGINE_PLACEHOLDERS",
    "EXTRA_OPTION_KEYS",
    "FrontierPoint",
    "PlanOption",
    "ServingPlan",
    "SloTier",
    "default_slo",
    "frontier",
    "plan",
    "plan_frontiers",
    "plan_many",
    "replica_throughput",
]
