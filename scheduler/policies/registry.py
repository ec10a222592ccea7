"""Policies looked up by name through an enum, never by if/elif on strings."""

from __future__ import annotations

import importlib
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.policies.base import Policy

__all__ = ["PolicyName", "get_policy"]


class PolicyName(StrEnum):
    RIGHTSIZE = "rightsize"
    REQUESTED = "requested"
    FIRSTFIT = "firstfit"
    BESTFIT = "bestfit"
    EASY_BACKFILL = "easy_backfill"
    FGD = "fgd"
    OPTIMAL = "optimal"
    # The openb node scorers (scheduler/policies/node_score.py): they score nodes on CPU as
    # well as GPU, as the FGD paper's simulator does.
    FGD_NODE = "fgd_node"
    FGD_STRAND = "fgdstrand"
    LOOKAHEAD = "lookahead"
    BESTFIT_NODE = "bestfit_node"
    DOTPRODUCT = "dotproduct"
    GPUPACKING = "gpupacking"
    GPUCLUSTERING = "gpuclustering"
    RANDOM = "random"


# name -> "module:Class"; modules import lazily so the ILP solver loads only when asked for.
_REGISTRY: dict[PolicyName, str] = {
    PolicyName.RIGHTSIZE: "scheduler.policies.rightsize:RightSizePolicy",
    PolicyName.REQUESTED: "scheduler.policies.requested:RequestedPolicy",
    PolicyName.FIRSTFIT: "scheduler.policies.firstfit:FirstFitPolicy",
    PolicyName.BESTFIT: "scheduler.policies.bestfit:BestFitPolicy",
    PolicyName.EASY_BACKFILL: "scheduler.policies.easy_backfill:EasyBackfillPolicy",
    PolicyName.FGD: "scheduler.policies.fgd:FgdPolicy",
    PolicyName.OPTIMAL: "scheduler.policies.optimal:OptimalPolicy",
    PolicyName.FGD_NODE: "scheduler.policies.node_score:FgdNodePolicy",
    PolicyName.FGD_STRAND: "scheduler.policies.node_score:FgdStrandPolicy",
    PolicyName.LOOKAHEAD: "scheduler.policies.lookahead:LookaheadPolicy",
    PolicyName.BESTFIT_NODE: "scheduler.policies.node_score:BestFitNodePolicy",
    PolicyName.DOTPRODUCT: "scheduler.policies.node_score:DotProductPolicy",
    PolicyName.GPUPACKING: "scheduler.policies.node_score:GpuPackingPolicy",
    PolicyName.GPUCLUSTERING: "scheduler.policies.node_score:GpuClusteringPolicy",
    PolicyName.RANDOM: "scheduler.policies.node_score:RandomNodePolicy",
}


def get_policy(name: str | PolicyName, **options: Any) -> Policy:
    """Instantiate a policy by name; ``options`` go to its constructor."""
    from scheduler.exceptions import PolicyError

    try:
        key = PolicyName(name)
    except ValueError:
        raise PolicyError(
            f"unknown policy {name!r}; choose one of {', '.join(p.value for p in PolicyName)}"
        ) from None
    module_name, _, cls_name = _REGISTRY[key].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    policy: Policy = cls(**options)
    return policy
