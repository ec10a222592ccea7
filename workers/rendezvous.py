"""The torchrun rendezvous of a multi-node gang: which rank this node runs, and its environment.

A gang's placement record lists its nodes in rank order (:class:`GangRank`); the worker on each
node starts its share of the GPUs with torchrun's environment contract, so a command that is
``torchrun`` itself, or a script that reads these variables, joins the same job:

``MASTER_ADDR``  node 0's name (the pool's node names are the hosts' names)
``MASTER_PORT``  a port stable per (job, attempt), from the placement record
``WORLD_SIZE``   the gang's GPUs (one process per GPU)
``NNODES``, ``NODE_RANK``, ``LOCAL_WORLD_SIZE`` (GPUs on this node)
``RANK``, ``LOCAL_RANK``  of the node's first process (``rank_offset`` and 0); torchrun, or the
                 command's own per-GPU launcher, derives the others from them
"""

from __future__ import annotations

from scheduler.service.store.records import GangRank, PlacementRecord

__all__ = ["node_rank_of", "torchrun_env"]


def node_rank_of(p: PlacementRecord, node: str) -> GangRank | None:
    """This node's entry of ``p``'s gang (None: not a gang, or the node is not in it)."""
    if p.gang is None:
        return None
    return next((r for r in p.gang if r.node == node), None)


def torchrun_env(p: PlacementRecord, rank: GangRank) -> dict[str, str]:
    """torchrun's environment contract for ``rank`` of ``p``'s gang."""
    assert p.gang is not None and p.master_port is not None
    world = sum(len(r.gpu_indices) for r in p.gang)
    return {
        "MASTER_ADDR": p.gang[0].node,
        "MASTER_PORT": str(p.master_port),
        "WORLD_SIZE": str(world),
        "NNODES": str(len(p.gang)),
        "NODE_RANK": str(rank.node_rank),
        "LOCAL_WORLD_SIZE": str(len(rank.gpu_indices)),
        "RANK": str(rank.rank_offset),
        "LOCAL_RANK": "0",
    }
