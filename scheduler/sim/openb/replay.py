"""Replay of the Alibaba GPU v2023 "openb" trace under the FGD paper's protocol.

Protocol (Weng et al., ATC'23, §6; the authors' simulator, hkust-adsl/kubernetes-scheduler-
simulator, ``TunePodsByNodeTotalResource`` and ``SortClusterPods``):

1. The cluster is the node list (1,213 nodes, 6,212 GPUs for ``openb_node_list_gpu_node``,
   the list the paper's runs use).
2. The workload is the pod list shuffled and "tuned up": pods re-sampled uniformly (with
   replacement) from the trace are appended after it until the total GPU request reaches
   130% of cluster GPU capacity (lists above 130% lose random pods instead). Both draws come
   from the seed.
3. Pods arrive one by one and never leave. Each is placed on a node that passes the filter
   (CPU, memory, enough GPUs with room for its per-GPU request, GPU-type constraint) or fails.
4. After each arrival we record the GPU allocation ratio; the headline is the share of GPU
   capacity still unallocated when arrived demand reaches 130%.

Node choice follows the simulator's score plugins (integer k8s scores 0..100, ties broken by
a per-seed random node order, as the simulator does after renaming nodes with a random
prefix); the GPU inside the node follows each policy's GPU-selection method. The scorers are
:mod:`scheduler.policies._node_scorers`, the same code the live policies
(:mod:`scheduler.policies.node_score`) and the replay through ``SchedulerCore``
(:mod:`scheduler.sim.openb.core_replay`) run; this module is the vectorised reference that
path is checked against (same placements pod for pod; on the ``gpuspec`` lists the core
carries a pod's GPU-model constraint as a node selector on the ``gpu-model`` label).

``fgdstrand`` is ours: FGD plus the decrease of stranded GPU capacity
(:mod:`scheduler.policies._stranding_maths`), GPUs a node will not be able to use because the
arrival mix's CPU or memory per GPU exhausts the node first.

``lookahead`` is ours too (our best): the decrease of the chosen GPU gap's expected waste over
the next arrivals of the pod list's mix, plus FGD-strand's stranding term
(:mod:`scheduler.policies.lookahead`).

``DotProduct`` is approximated (Tetris alignment on normalised (CPU, GPU) vectors, the chosen
GPU's free share standing in for the simulator's "merge" dimension extension).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from scheduler.exceptions import TraceError
from scheduler.policies._lookahead_maths import DEFAULT_LOOKAHEAD_ARRIVALS
from scheduler.policies._node_scorers import (
    FIXED_SCORERS,
    MAX_GPUS_PER_NODE,
    MILLI_PER_GPU,
    N_TAGS,
    STRANDING_WEIGHT,
    NodeView,
    PodShape,
    make_fgd,
    state_key,
    tag_of,
)
from scheduler.policies._stranding_maths import demand_ratios
from scheduler.policies.fgd import class_terms, fragmentation_from_terms, typical_task_classes
from scheduler.policies.lookahead import lookahead_for_mix
from scheduler.sim.openb.trace import (
    TARGET_DEMAND_RATIO,
    OpenbCluster,
    OpenbWorkload,
    seeded_run,
)

__all__ = ["STRANDING_WEIGHT", "OpenbPolicy", "OpenbResult", "replay", "replay_seeds"]


class OpenbPolicy(StrEnum):
    FGD = "fgd"
    FGD_STRAND = "fgdstrand"
    LOOKAHEAD = "lookahead"
    BESTFIT = "bestfit"
    RANDOM = "random"
    DOTPRODUCT = "dotproduct"
    GPUPACKING = "gpupacking"
    GPUCLUSTERING = "gpuclustering"


@dataclass
class OpenbResult:
    """One replay: the allocation curve and the headline."""

    policy: str
    seed: int
    arrived_pct: np.ndarray  # (P,) cumulative arrived GPU demand after each pod, % capacity
    allocated_pct: np.ndarray  # (P,) allocated GPU, % capacity, after each pod
    n_pods: int
    n_failed: int
    wall_s: float
    # (P,) index of the node each pod went to, in arrival order; -1 where it failed.
    placed_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    extras: dict[str, Any] = field(default_factory=dict)

    def allocation_at(self, demand_pct: np.ndarray) -> np.ndarray:
        """GPU allocation % once arrived demand first reaches each ``demand_pct``."""
        i = np.searchsorted(self.arrived_pct, demand_pct, side="left")
        i = np.minimum(i, self.arrived_pct.size - 1)
        return np.where(demand_pct <= 0, 0.0, self.allocated_pct[i])

    @property
    def unallocated_gpu_pct_at_end(self) -> float:
        return float(100.0 - self.allocated_pct[-1])

    @classmethod
    def of_run(
        cls,
        policy: str,
        seed: int,
        workload: OpenbWorkload,
        capacity: int,
        allocated: np.ndarray,
        placed: np.ndarray,
        started: float,
        extras: dict[str, Any],
    ) -> OpenbResult:
        """One engine's run of ``workload`` (the tuned pods, in arrival order): GPU milli
        allocated after each pod, each pod's node (-1: it failed), and when the run started
        (``time.perf_counter``)."""
        demand = np.cumsum(workload.total_gpu_milli).astype(float)
        return cls(
            policy=policy,
            seed=seed,
            arrived_pct=100.0 * demand / capacity,
            allocated_pct=100.0 * allocated / capacity,
            n_pods=len(placed),
            n_failed=int((placed < 0).sum()),
            wall_s=time.perf_counter() - started,
            placed_node=placed,
            extras=extras,
        )


def replay(
    cluster: OpenbCluster,
    pods: OpenbWorkload,
    policy: str | OpenbPolicy,
    seed: int,
    demand_ratio: float = TARGET_DEMAND_RATIO,
    *,
    arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS,
    learn_every: int = 0,
) -> OpenbResult:
    """Replay one seed of the protocol; see the module docstring. ``arrivals`` is the
    look-ahead depth of ``lookahead``; with ``learn_every > 0`` its mix is not the pod list's
    but the pods arrived so far, re-learned every ``learn_every`` arrivals (the other policies
    ignore both)."""
    try:
        pol = OpenbPolicy(policy)
    except ValueError:
        raise TraceError(
            f"unknown openb policy {policy!r}; choose one of "
            f"{', '.join(p.value for p in OpenbPolicy)}"
        ) from None
    t0 = time.perf_counter()
    rng, capacity, workload, node_rank = seeded_run(cluster, pods, seed, demand_ratio)

    n = len(cluster.names)
    slot = np.arange(MAX_GPUS_PER_NODE)[None, :]
    gpu_mask = slot < cluster.n_gpu[:, None]
    st = NodeView(
        cpu_free=cluster.cpu_milli.astype(np.int64).copy(),
        mem_free=cluster.memory_mib.astype(np.int64).copy(),
        gpu_free=np.where(gpu_mask, MILLI_PER_GPU, 0).astype(np.int64),
        tags=np.zeros((n, N_TAGS), np.int64),
        n_gpu=cluster.n_gpu,
    )
    if pol in (OpenbPolicy.FGD, OpenbPolicy.FGD_STRAND):
        # Target workload = the trace's own pods (before tuning), CPU-only pods included.
        classes = typical_task_classes(pods.cpu_milli, pods.gpu_milli, pods.num_gpu)
        terms = class_terms(st.gpu_free, classes)
        st.fgd = (*terms, fragmentation_from_terms(*terms, st.cpu_free.astype(float), classes))
        strand = None
        if pol is OpenbPolicy.FGD_STRAND:
            ratios = demand_ratios(pods.cpu_milli, pods.memory_mib, pods.num_gpu, pods.gpu_milli)
            strand = (ratios, STRANDING_WEIGHT)
        scorer = make_fgd(classes, strand)
        key_mem = strand is not None
        st.key = state_key(st, slice(None), key_mem)
    elif pol is OpenbPolicy.LOOKAHEAD:
        # The arrival mix = the trace's own pods (before tuning), as FGD's target workload.
        classes, strand = None, None
        scorer = lookahead_for_mix(
            pods.cpu_milli, pods.memory_mib, pods.num_gpu, pods.gpu_milli, arrivals
        )
        key_mem = True
        st.key = state_key(st, slice(None), key_mem)
    else:
        classes, strand, key_mem = None, None, False
        scorer = FIXED_SCORERS[pol.value]
    models = np.array(cluster.model)

    # Per node: the roomiest GPU and the count of whole free GPUs, kept incrementally so the
    # filter does not rescan every GPU slot for every pod.
    max_free = st.gpu_free.max(1)
    n_full = (st.gpu_free >= MILLI_PER_GPU).sum(1)
    n_pods = len(workload)
    allocated = np.zeros(n_pods)
    placed = np.full(n_pods, -1, np.int64)
    alloc_milli = 0
    cpu_a, mem_a = workload.cpu_milli, workload.memory_mib
    ng_a, gm_a = workload.num_gpu, workload.gpu_milli
    learn = learn_every > 0 and pol is OpenbPolicy.LOOKAHEAD
    for i in range(n_pods):
        pod = PodShape(int(cpu_a[i]), int(mem_a[i]), int(ng_a[i]), int(gm_a[i]))
        if learn and i % learn_every == 0:
            # Online: the mix of the pods seen so far, this one included, none after it.
            seen = slice(0, i + 1)
            scorer = lookahead_for_mix(cpu_a[seen], mem_a[seen], ng_a[seen], gm_a[seen], arrivals)
        ok = (st.cpu_free >= pod.cpu) & (st.mem_free >= pod.mem)
        if pod.num_gpu == 1:
            ok &= max_free >= pod.milli
        elif pod.num_gpu > 1:  # multi-GPU pods ask whole GPUs (checked when loading)
            ok &= n_full >= pod.num_gpu
        spec = workload.gpu_spec[i]
        if spec and pod.num_gpu > 0:
            ok &= np.isin(models, list(spec))
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            allocated[i] = alloc_milli
            continue
        score, gpu = scorer(st, idx, pod, rng)
        best = np.flatnonzero(score == score.max())
        # kube-scheduler in the authors' simulator resolves ties by node order, and node
        # order is a per-seed random permutation; this concentrates equal-score pods (e.g.
        # CPU-only pods under FGD) instead of spreading them, which matters a lot.
        k = int(best[np.argmin(node_rank[idx[best]])]) if best.size > 1 else int(best[0])
        node = int(idx[k])
        placed[i] = node
        st.cpu_free[node] -= pod.cpu
        st.mem_free[node] -= pod.mem
        if pod.num_gpu > 0:
            if pod.is_share:
                st.gpu_free[node, int(gpu[k])] -= pod.milli
            else:
                free_slots = np.flatnonzero(st.gpu_free[node] >= MILLI_PER_GPU)[: pod.num_gpu]
                st.gpu_free[node, free_slots] -= MILLI_PER_GPU
            alloc_milli += pod.num_gpu * pod.milli
            t = tag_of(pod.num_gpu, pod.milli)
            if t >= 0:
                st.tags[node, t] += 1
        max_free[node] = st.gpu_free[node].max()
        n_full[node] = int((st.gpu_free[node] >= MILLI_PER_GPU).sum())
        if st.key is not None:
            st.key[node] = state_key(st, slice(node, node + 1), key_mem)[0]
        if st.fgd is not None and classes is not None:
            count, small, total, frag = st.fgd
            c1, s1, t1 = class_terms(st.gpu_free[node : node + 1], classes)
            count[node], small[node], total[node] = c1[0], s1[0], t1[0]
            frag[node] = fragmentation_from_terms(
                c1, s1, t1, st.cpu_free[node : node + 1].astype(float), classes
            )[0]
        allocated[i] = alloc_milli
    ran = {"engine": "replay"}
    return OpenbResult.of_run(pol.value, seed, workload, capacity, allocated, placed, t0, ran)


#: One seed of a replay engine: this module's :func:`replay`, or the core path
#: (:func:`scheduler.sim.openb.core_replay.replay_core`).
Runner = Callable[[OpenbCluster, OpenbWorkload, str, int, float], "OpenbResult"]


def replay_seeds(
    cluster: OpenbCluster,
    pods: OpenbWorkload,
    policy: str | OpenbPolicy,
    seeds: Sequence[int],
    demand_ratio: float = TARGET_DEMAND_RATIO,
    runner: Runner | None = None,
) -> dict[str, Any]:
    """Mean over seeds of the allocation curve (0..130% in 1-point steps) and the headline;
    ``runner`` replays one seed (default: this module's :func:`replay`)."""
    run: Runner = runner if runner is not None else replay
    grid = np.arange(0, round(demand_ratio * 100) + 1)
    curves = []
    unalloc = []
    walls = []
    failed = []
    extras: dict[str, Any] = {}
    cpu = []
    for s in seeds:
        # CPU seconds beside wall seconds: on a shared machine the wall clock counts the
        # neighbours too.
        c0 = time.process_time()
        r = run(cluster, pods, str(policy), s, demand_ratio)
        cpu.append(time.process_time() - c0)
        extras = r.extras
        curves.append(r.allocation_at(grid.astype(float)))
        unalloc.append(r.unallocated_gpu_pct_at_end)
        walls.append(r.wall_s)
        failed.append(r.n_failed)
    mean_curve = np.mean(curves, axis=0)
    return {
        "policy": str(policy),
        **extras,
        "seeds": list(seeds),
        "n_nodes": len(cluster.names),
        "n_gpus": int(cluster.n_gpu.sum()),
        "allocation_ratio_by_demand": {
            str(int(g)): round(float(v), 3) for g, v in zip(grid, mean_curve, strict=True)
        },
        "unallocated_gpu_pct_at_130": round(float(np.mean(unalloc)), 3),
        "unallocated_gpu_pct_per_seed": [round(float(u), 3) for u in unalloc],
        "unallocated_gpu_pct_std": round(float(np.std(unalloc)), 3),
        "failed_pods_mean": float(np.mean(failed)),
        "wall_s_per_seed": round(float(np.mean(walls)), 3),
        "wall_s_max": round(float(np.max(walls)), 3),
        "wall_s_each_seed": [round(float(w), 3) for w in walls],
        "cpu_s_per_seed": round(float(np.mean(cpu)), 3),
    }
