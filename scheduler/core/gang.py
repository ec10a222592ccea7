"""Multi-node gangs: a whole-GPU job larger than any one node of its GPU type.

A gang takes ``n_gpus`` whole GPUs of one type on ``n_nodes`` nodes, the same share
``n_gpus / n_nodes`` on each, all or nothing. The share divides both the job's GPU count and the
size of every node it uses (so gangs tile nodes without leaving odd remainders), and it is a
multiple of ``tensor_parallel``: tensor-parallel groups need NVLink and stay inside a node, data
and pipeline parallelism cross nodes. Jobs that fit one node never become gangs, so their
placement is unchanged.

Choice: among the shares that fit now, the plan spanning the fewest racks wins (a node's
``rack`` in the pool file; nodes without one share one unnamed rack), then the fewest nodes.
Inside that, ``pack`` fills the fullest nodes that still hold the share (as single-node
placement does), ``first`` takes the lowest node indices.

Host resources: each node takes its share of the gang's slot (``share / node GPUs`` of its CPUs
and memory); a job that names its own ``cpus`` or ``host_memory_gib`` splits them evenly over
its nodes. The predictor's host-memory floor applies per node (every rank loads the model).
Everything here is pure numpy over the pool's nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictor.gpus import GPU_NAMES
from predictor.internode import GradientSync, internode_allreduce_s, internode_pipeline_s
from scheduler.core._classes import node_max_size
from scheduler.core.host import HostAsk, class_nodes, demand, fmt_cpus
from scheduler.core.pool import KIND_WHOLE, MIB_PER_GIB, Pool

__all__ = [
    "GangPlan",
    "gang_mask",
    "gang_network_s",
    "gang_reason",
    "gang_types",
    "node_ask",
    "node_racks",
    "plan_gang",
    "rank_layout",
    "shares",
]


@dataclass(frozen=True, slots=True)
class GangPlan:
    """Where a gang goes: node indices in rank order, GPUs per node, racks spanned."""

    nodes: tuple[int, ...]
    share: int
    racks: int


def gang_mask(pool: Pool, n: np.ndarray) -> np.ndarray:
    """(jobs, classes): the whole-GPU classes where a job of ``n`` GPUs needs several nodes."""
    ct = pool.class_type
    whole = pool.class_kind == KIND_WHOLE
    largest = node_max_size(pool)[ct]
    return whole[None, :] & (n[:, None] > largest[None, :]) & (largest[None, :] > 0)


def shares(n_gpus: int, tensor_parallel: int, largest_node: int) -> list[int]:
    """GPUs per node a gang may take, largest first (fewer nodes first): divisors of
    ``n_gpus`` that hold whole tensor-parallel groups and fit the largest node."""
    tp = max(1, tensor_parallel)
    return [
        s for s in range(min(n_gpus - 1, largest_node), 0, -1) if n_gpus % s == 0 and s % tp == 0
    ]


def gang_types(pool: Pool, n_gpus: int, tensor_parallel: int) -> np.ndarray:
    """Per GPU type, whether an empty pool holds a multi-node gang of ``n_gpus`` whole GPUs at
    ``tensor_parallel`` there (some share of :func:`shares` on enough whole nodes dividing by
    it); GPUs only, as :func:`plan_gang` counts them. False where a node holds the job alone."""
    out = np.zeros(len(GPU_NAMES), bool)
    largest = node_max_size(pool)
    for t in np.flatnonzero((largest > 0) & (largest < n_gpus)).tolist():
        nodes = pool.node_whole & (pool.node_type == t)
        for s in shares(n_gpus, tensor_parallel, int(largest[t])):
            if int((nodes & (pool.node_count % s == 0)).sum()) >= n_gpus // s:
                out[t] = True
                break
    return out


def node_racks(pool: Pool) -> np.ndarray:
    """Per node, a rack id (nodes without a rack share id -1)."""
    cached = pool._empty.get("node_racks")
    if cached is None:
        ids: dict[str, int] = {}
        cached = np.array(
            [-1 if n.rack is None else ids.setdefault(n.rack, len(ids)) for n in pool.nodes],
            np.int64,
        )
        pool._empty["node_racks"] = cached
    return cached  # type: ignore[no-any-return]


def node_ask(ask: HostAsk, n_nodes: int) -> HostAsk:
    """The per-node host ask of a gang: the job's own figures split evenly (rounded up)."""
    cpu = ask.cpu_milli if ask.cpu_milli < 0 else math.ceil(ask.cpu_milli / n_nodes)
    host = ask.host_mib if ask.host_mib < 0 else math.ceil(ask.host_mib / n_nodes)
    return HostAsk(cpu, host, ask.floor_mib)


def _fits(
    pool: Pool,
    c: int,
    s: int,
    m: int,
    need_mib: int,
    ask: HostAsk,
    node_free: np.ndarray,
    cpu_free: np.ndarray,
    host_free: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per node: (GPU side fits the share, every resource fits) for share ``s`` of ``m`` nodes."""
    d_cpu, d_host = demand(pool, c, s, node_ask(ask, m), need_mib)
    gpu_ok = class_nodes(pool)[c] & (pool.node_count % s == 0) & (node_free >= s)
    return gpu_ok, gpu_ok & (d_cpu <= cpu_free) & (d_host <= host_free)


def _choose(
    pool: Pool, ok: np.ndarray, m: int, node_free: np.ndarray, select: str
) -> tuple[tuple[int, ...], int]:
    """``m`` nodes among ``ok`` on the fewest racks: (node indices, racks used)."""
    idx = np.flatnonzero(ok)
    rack = node_racks(pool)[idx]
    names, counts = np.unique(rack, return_counts=True)
    # pack: fullest first, then index; first: index order
    key = np.lexsort((idx, node_free[idx])) if select == "pack" else np.arange(idx.size)
    idx, rack = idx[key], rack[key]
    alone = counts >= m
    if alone.any():
        # One rack holds it: the tightest such rack (pack) or the first.
        pick = np.flatnonzero(alone)
        r = pick[np.argmin(counts[pick])] if select == "pack" else pick[0]
        order = [names[r]]
    else:
        order = names[np.argsort(-counts, kind="stable")].tolist()
    chosen: list[int] = []
    used = 0
    for r in order:
        members = idx[rack == r][: m - len(chosen)].tolist()
        chosen += members
        used += 1
        if len(chosen) >= m:
            break
    return tuple(int(k) for k in chosen), used


def plan_gang(
    pool: Pool,
    c: int,
    n_gpus: int,
    tensor_parallel: int,
    need_mib: int,
    ask: HostAsk,
    node_free: np.ndarray,
    cpu_free: np.ndarray,
    host_free: np.ndarray,
    select: str = "pack",
) -> GangPlan | None:
    """The gang placement for class ``c`` given free GPUs, millicores and MiB per node, or
    None when no share fits on enough nodes."""
    largest = int(node_max_size(pool)[int(pool.class_type[c])])
    best: GangPlan | None = None
    for s in shares(n_gpus, tensor_parallel, largest):
        m = n_gpus // s
        _, ok = _fits(pool, c, s, m, need_mib, ask, node_free, cpu_free, host_free)
        if int(ok.sum()) < m:
            continue
        nodes, racks = _choose(pool, ok, m, node_free, select)
        # Shares come largest first, so a later plan wins only on strictly fewer racks.
        if best is None or racks < best.racks:
            best = GangPlan(nodes, s, racks)
        if best.racks == 1:
            break
    return best


def gang_network_s(
    pool: Pool, c: int, n_gpus: int, tensor_parallel: int, sync: GradientSync
) -> tuple[float, float]:
    """(seconds the predicted runtime already charges for inter-node traffic, seconds it
    takes as a gang of class ``c``): the gradient all-reduce and the pipeline's activations
    between stages on different nodes (none of which the prediction charges), over the plan
    with the fewest nodes, on the slowest ``network_gbps`` among the nodes that could take that
    share (:mod:`predictor.internode`). A gang's runtime is the prediction less the first plus
    the second. State-independent, so a conservative price."""
    largest = int(node_max_size(pool)[int(pool.class_type[c])])
    options = shares(n_gpus, tensor_parallel, largest)
    if not options or sync.steps <= 0:
        return 0.0, 0.0
    s = options[0]
    nodes = class_nodes(pool)[c] & (pool.node_count % s == 0)
    gbps = min(pool.nodes[k].network_gbps for k in np.flatnonzero(nodes).tolist())
    m = n_gpus // s
    net = internode_allreduce_s(sync, s, m, gbps) + internode_pipeline_s(sync, s, m, gbps)
    return sync.charged_s, net


def rank_layout(pool: Pool, plan: GangPlan, node_idle: list[list[int]]) -> tuple[int, ...]:
    """The gang's GPU indices in rank order: the first ``share`` idle GPUs of each node."""
    gpus: list[int] = []
    for k, idle in zip(plan.nodes, node_idle, strict=True):
        assert len(idle) >= plan.share, f"node {pool.nodes[k].name} lacks idle GPUs"
        gpus += idle[: plan.share]
    return tuple(gpus)


def gang_reason(
    pool: Pool,
    c: int,
    n_gpus: int,
    tensor_parallel: int,
    need_mib: int,
    ask: HostAsk,
    node_free: np.ndarray,
    cpu_free: np.ndarray,
    host_free: np.ndarray,
    *,
    empty: bool,
) -> str:
    """Why no gang of class ``c`` fits (``empty``: even on an empty pool), for the share with
    the fewest nodes: "needs 16 GPUs of H100-80GB across 2 nodes; only 1 node has 8 free"."""
    t = GPU_NAMES[int(pool.class_type[c])]
    largest = int(node_max_size(pool)[int(pool.class_type[c])])
    options = shares(n_gpus, tensor_parallel, largest)
    if not options:
        return (
            f"{t}: needs {n_gpus} GPUs across nodes in shares of whole tensor_parallel="
            f"{tensor_parallel} groups; no share divides {n_gpus} and fits a {largest}-GPU node"
        )
    s = options[0]
    m = n_gpus // s
    gpu_ok, ok = _fits(pool, c, s, m, need_mib, ask, node_free, cpu_free, host_free)
    head = f"needs {n_gpus} GPUs of {t} across {m} nodes"
    if empty:
        head = f"{t}: {head}"
    have = int(gpu_ok.sum())
    if have < m:
        plural = "node has" if have == 1 else "nodes have"
        if empty:
            return f"{head} of {s} GPUs; only {have} whole {t} {plural} {s} GPUs"
        return f"{head}; only {have} {plural} {s} free"
    d_cpu, d_host = demand(pool, c, s, node_ask(ask, m), need_mib)
    k = int(np.flatnonzero(gpu_ok & ~ok)[0])
    name = pool.nodes[k].name
    if d_cpu[k] > cpu_free[k]:
        short = (
            f"needs {fmt_cpus(int(d_cpu[k]))} CPUs per node, "
            f"{fmt_cpus(int(cpu_free[k]))} free on {name}"
        )
    else:
        short = (
            f"needs {d_host[k] / MIB_PER_GIB:.1f} GiB host memory per node, "
            f"{host_free[k] / MIB_PER_GIB:.1f} GiB free on {name}"
        )
    return f"{head}; only {int(ok.sum())} of them have the CPUs and memory ({short})"
