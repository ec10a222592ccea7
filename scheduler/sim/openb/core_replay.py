"""The openb replay through snugfit's own scheduler: the pool built from the node list
(:mod:`scheduler.sim.openb.pool`), one :class:`~scheduler.core.loop.SchedulerCore` tick per
arriving pod, and the live policies of the registry (:mod:`scheduler.policies.node_score`).

Same protocol and the same draws as :func:`scheduler.sim.openb.replay.replay`: the seed tunes the
workload, then draws the node order that breaks ties, then feeds the Random scorer. A pod the
policy leaves pending has failed (pods never retry in the protocol) and is cancelled.

Policy names are the replay's; ``fgd`` and ``bestfit`` run the node-scoring policies
``fgd_node`` and ``bestfit_node`` (the live ``fgd`` and ``bestfit`` rank by GPU memory and do
not see CPU). ``rightsize`` delegates to ``lookahead`` here: rightsize ranks options by
price, and an openb pool has one GPU type at one price, so price says nothing; the openb
objective (GPU capacity allocated) is what ``lookahead``, our best scorer, optimises.

Every pod of every openb pod list goes through: a pod's ``gpu_spec`` (the ``gpuspec`` lists)
is its node selector on the nodes' ``gpu-model`` label (:mod:`scheduler.sim.openb.pool`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.core.clock import VirtualClock
from scheduler.core.loop import BatchMaker, SchedulerCore
from scheduler.core.options import OptionBatch
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import TraceError
from scheduler.policies._lookahead_maths import per_gpu_sizes
from scheduler.policies._node_scorers import MILLI_PER_GPU
from scheduler.policies._stranding_maths import demand_ratios
from scheduler.policies.base import Policy
from scheduler.policies.fgd import typical_task_classes
from scheduler.policies.registry import PolicyName, get_policy
from scheduler.sim.openb.pool import OpenbPool, openb_pool, openb_requests
from scheduler.sim.openb.replay import OpenbResult
from scheduler.sim.openb.trace import (
    TARGET_DEMAND_RATIO,
    OpenbCluster,
    OpenbWorkload,
    seeded_run,
)

__all__ = ["CORE_POLICY", "replay_core"]

#: The registry policy each openb policy name runs on the core path.
CORE_POLICY: dict[str, PolicyName] = {
    "fgd": PolicyName.FGD_NODE,
    "fgdstrand": PolicyName.FGD_STRAND,
    "lookahead": PolicyName.LOOKAHEAD,
    "bestfit": PolicyName.BESTFIT_NODE,
    "random": PolicyName.RANDOM,
    "dotproduct": PolicyName.DOTPRODUCT,
    "gpupacking": PolicyName.GPUPACKING,
    "gpuclustering": PolicyName.GPUCLUSTERING,
    "rightsize": PolicyName.LOOKAHEAD,
}


def _policy(
    name: str, pods: OpenbWorkload, node_rank: np.ndarray, rng: np.random.Generator
) -> Policy:
    try:
        key = CORE_POLICY[name]
    except KeyError:
        raise TraceError(
            f"unknown openb policy {name!r}; choose one of {', '.join(CORE_POLICY)}"
        ) from None
    opts: dict[str, Any] = {"node_rank": node_rank, "rng": rng}
    if key in (PolicyName.FGD_NODE, PolicyName.FGD_STRAND):
        # Target workload = the trace's own pods (before tuning), CPU-only pods included.
        opts["classes"] = typical_task_classes(pods.cpu_milli, pods.gpu_milli, pods.num_gpu)
    if key in (PolicyName.FGD_STRAND, PolicyName.LOOKAHEAD):
        opts["ratios"] = demand_ratios(
            pods.cpu_milli, pods.memory_mib, pods.num_gpu, pods.gpu_milli
        )
    if key is PolicyName.LOOKAHEAD:
        # The arrival mix it looks ahead over: the same pods as FGD's target workload.
        opts["sizes"] = per_gpu_sizes(pods.num_gpu, pods.gpu_milli, MILLI_PER_GPU)
    return get_policy(key, **opts)


def _prebuilt(requests: list[PlacementRequest], pool: Pool) -> BatchMaker:
    """The core's batch maker for this replay: every pod is known before the first tick, so
    one OptionBatch is built for all of them (one vectorised pass instead of one per tick) and
    each tick gets its pod's row as a view. Anything else gets a fresh batch, as by default."""
    full = OptionBatch(requests, pool)
    row_of = {r.job_id: i for i, r in enumerate(requests)}

    def batch_of(jobs: Sequence[PlacementRequest], on: Pool) -> OptionBatch:
        if len(jobs) == 1 and on is pool:
            i = row_of.get(jobs[0].job_id, -1)
            if i >= 0 and requests[i] is jobs[0]:
                return full.rows(i, i + 1)
        return OptionBatch(jobs, on)

    return batch_of


def replay_core(
    cluster: OpenbCluster,
    pods: OpenbWorkload,
    policy: str,
    seed: int,
    demand_ratio: float = TARGET_DEMAND_RATIO,
    opool: OpenbPool | None = None,
) -> OpenbResult:
    """Replay one seed through the core; ``extras`` names the registry policy that ran."""
    t0 = time.perf_counter()
    rng, capacity, workload, node_rank = seeded_run(cluster, pods, seed, demand_ratio)
    opool = opool if opool is not None else openb_pool(cluster)
    requests = openb_requests(workload, opool)
    pol = _policy(policy, pods, node_rank, rng)
    batches = _prebuilt(requests, opool.pool)
    core = SchedulerCore(opool.pool.state(), pol, VirtualClock(), batches=batches)
    node_of = {n.name: k for k, n in enumerate(opool.pool.nodes)}
    n_pods = len(requests)
    allocated = np.zeros(n_pods)
    placed = np.full(n_pods, -1, np.int64)
    milli = workload.total_gpu_milli
    alloc = 0
    for i, req in enumerate(requests):
        core.submit(req)
        (d,) = core.tick(float(i))
        if d.state == "placed":
            opt = d.chosen_option
            assert opt is not None and opt.node is not None
            placed[i] = node_of[opt.node]
            alloc += int(milli[i])
        elif d.state == "pending":  # a pod that cannot start now has failed
            core.cancel(req.job_id)
        allocated[i] = alloc
    ran = {"engine": "core", "registry_policy": CORE_POLICY[policy].value}
    return OpenbResult.of_run(policy, seed, workload, capacity, allocated, placed, t0, ran)
