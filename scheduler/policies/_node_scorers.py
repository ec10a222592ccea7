"""Node scorers of the FGD paper's simulator, on plain arrays: one implementation shared by the
openb replay (:mod:`scheduler.sim.openb.replay`) and the live policies
(:mod:`scheduler.policies.node_score`).

Each scorer follows the score plugin of the authors' simulator (hkust-adsl/kubernetes-scheduler-
simulator): an integer kube-scheduler score 0..100 per candidate node, and for a one-GPU share
pod the GPU inside the node. Units are the simulator's: milli-CPU, MiB of host memory,
milli-GPU (1000 = one whole GPU) per GPU slot.

``DotProduct`` is an approximation: Tetris alignment of normalised (CPU, GPU) vectors, with the
chosen GPU's free share standing in for the simulator's "merge" dimension extension (which
scores every GPU as an extra dimension). ``fgdstrand`` is ours: FGD plus the decrease of
stranded GPU capacity (:mod:`scheduler.policies._stranding_maths`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scheduler.policies._stranding_maths import DemandRatios, stranding_decrease
from scheduler.policies.fgd import (
    TaskClasses,
    share_candidates_fragmentation,
    whole_fragmentation_from_terms,
)

__all__ = [
    "FIXED_SCORERS",
    "MAX_GPUS_PER_NODE",
    "MAX_SPEC_CPU_MILLI",
    "MAX_SPEC_GPU_MILLI",
    "MILLI_PER_GPU",
    "N_TAGS",
    "STRANDING_WEIGHT",
    "NodeView",
    "PodShape",
    "Scorer",
    "best_gpu",
    "make_fgd",
    "score_bestfit",
    "score_dotproduct",
    "score_gpuclustering",
    "score_gpupacking",
    "score_random",
    "sigmoid_score",
    "state_key",
    "tag_of",
]


MILLI_PER_GPU = 1000


MAX_GPUS_PER_NODE = 8


# Normalisers the simulator's scorers use (gpushareutils.MaxSpecCpu / MaxSpecGpu).
MAX_SPEC_CPU_MILLI = 128_000


MAX_SPEC_GPU_MILLI = 8_000


# FGD-strand's weight on the stranded-capacity decrease, relative to FGD's fragmentation
# decrease (both in milli-GPU). Chosen on openb `default` with a few seeds; the result is flat
# between 0.5 and 8, so it is not a fine-tuned constant.
STRANDING_WEIGHT = 2.0


@dataclass
class NodeView:
    """What the scorers see of a cluster: free milli-CPU, MiB and milli-GPU per GPU slot.

    The openb replay keeps one and updates it in place; the live policies build one from a
    :class:`~scheduler.core.state.PoolState` (:mod:`scheduler.policies.node_score`).
    """

    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_free: np.ndarray  # (N, G), 0-padded beyond each node's GPU count
    tags: np.ndarray  # (N, n_tags) pods per GPU-affinity tag, for GpuClustering
    n_gpu: np.ndarray  # (N,) GPUs per node
    # FGD per-node class terms (count, small_free, total) and fragmentation, kept incrementally.
    fgd: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    # FGD's per-node state key (equal keys = equal scores), kept incrementally.
    key: np.ndarray | None = None
    # (N,) each node's largest free milli-GPU (its shared-GPU fit test), kept incrementally by
    # the live policies (scheduler.policies.node_score); None: not kept.
    gpu_max: np.ndarray | None = None


# GPU-affinity tags of the GpuClustering baseline: share, 1, 2, 4, 8 GPUs (others -> last).
_TAG_OF_NUM = {1: 1, 2: 2, 4: 3, 8: 4}


N_TAGS = 6


def tag_of(num_gpu: int, gpu_milli: int) -> int:
    if num_gpu == 0:
        return -1
    if num_gpu == 1 and gpu_milli < MILLI_PER_GPU:
        return 0
    return _TAG_OF_NUM.get(num_gpu, 5)


@dataclass(frozen=True, slots=True)
class PodShape:
    cpu: int
    mem: int
    num_gpu: int
    milli: int

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.milli < MILLI_PER_GPU


# A scorer returns (score per candidate node, chosen GPU slot per node or -1 for "any free").
Scorer = Callable[
    [NodeView, np.ndarray, PodShape, np.random.Generator], tuple[np.ndarray, np.ndarray]
]


def best_gpu(gpu_free: np.ndarray, milli: int) -> np.ndarray:
    """Tightest GPU with room (first among equals), per node; the simulator's 'best' selector."""
    masked = np.where(gpu_free >= milli, gpu_free, np.iinfo(np.int64).max)
    return np.argmin(masked, axis=1)


def score_random(
    st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    score = rng.integers(0, 101, idx.size).astype(float)
    if pod.is_share:
        fits = st.gpu_free[idx] >= pod.milli
        # Uniform choice among the GPUs with room.
        r = np.where(fits, rng.random(fits.shape), -1.0)
        return score, np.argmax(r, axis=1)
    return score, np.full(idx.size, -1)


def score_bestfit(
    st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    cpu_left = st.cpu_free[idx] - pod.cpu
    gpu_left = st.gpu_free[idx].sum(1) - pod.num_gpu * pod.milli
    s = (cpu_left / MAX_SPEC_CPU_MILLI + gpu_left / MAX_SPEC_GPU_MILLI) * 0.5
    score = np.trunc((1.0 - s) * 100.0)
    gpu = best_gpu(st.gpu_free[idx], pod.milli) if pod.is_share else np.full(idx.size, -1)
    return score, gpu


def score_dotproduct(
    st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    cpu_node = st.cpu_free[idx] / MAX_SPEC_CPU_MILLI
    cpu_pod = pod.cpu / MAX_SPEC_CPU_MILLI
    if pod.is_share:
        g = st.gpu_free[idx] / MILLI_PER_GPU  # (F, 8)
        dot = (cpu_node[:, None] * cpu_pod + g * (pod.milli / MILLI_PER_GPU)) / 2.0
        s = np.where(st.gpu_free[idx] >= pod.milli, 1.0 - dot, -1.0)
        gpu = np.argmax(s, axis=1)
        return np.trunc(100.0 * s.max(1)), gpu
    gpu_node = st.gpu_free[idx].sum(1) / MAX_SPEC_GPU_MILLI
    gpu_pod = pod.num_gpu * pod.milli / MAX_SPEC_GPU_MILLI
    dot = (cpu_node * cpu_pod + gpu_node * gpu_pod) / 2.0
    return np.trunc(100.0 * (1.0 - dot)), np.full(idx.size, -1)


def score_gpupacking(
    st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    if pod.num_gpu == 0:
        return np.zeros(idx.size), np.full(idx.size, -1)
    free = st.gpu_free[idx]
    n_gpu_node = st.n_gpu[idx]
    fully_free = (free >= MILLI_PER_GPU).sum(1)
    all_free = fully_free == n_gpu_node
    case3 = np.maximum(100 // 3 - fully_free, fully_free)
    if pod.is_share:
        gpu = best_gpu(free, pod.milli)
        chosen = free[np.arange(idx.size), gpu]
        uses_full = chosen >= MILLI_PER_GPU
        ratio = chosen * 100 // MILLI_PER_GPU
        case1 = np.maximum(100 - ratio // 10, 50)
        case2 = np.maximum(50 - 1, 100 // 3)
        score = np.where(all_free, case3, np.where(uses_full, case2, case1))
        return score.astype(float), gpu
    # Whole GPUs: always fully free ones.
    case2 = np.maximum(50 - pod.num_gpu, 100 // 3)
    score = np.where(all_free, case3, case2)
    return score.astype(float), np.full(idx.size, -1)


def score_gpuclustering(
    st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    tag = tag_of(pod.num_gpu, pod.milli)
    if tag < 0:
        return np.zeros(idx.size), np.full(idx.size, -1)
    tags = st.tags[idx] > 0
    n_tags = tags.sum(1)
    has = tags[:, tag]
    base = 25 * (MAX_SPEC_GPU_MILLI - st.gpu_free[idx].sum(1)) // MAX_SPEC_GPU_MILLI
    bonus = np.where(has, np.where(n_tags == 1, 75, 50), np.where(n_tags == 0, 25, 0))
    gpu = best_gpu(st.gpu_free[idx], pod.milli) if pod.is_share else np.full(idx.size, -1)
    return (base + bonus).astype(float), gpu


#: The scorers that ignore the workload, by the openb policy name that runs them.
FIXED_SCORERS: dict[str, Scorer] = {
    "random": score_random,
    "bestfit": score_bestfit,
    "dotproduct": score_dotproduct,
    "gpupacking": score_gpupacking,
    "gpuclustering": score_gpuclustering,
}


def make_fgd(classes: TaskClasses, strand: tuple[DemandRatios, float] | None = None) -> Scorer:
    """FGD's node score; with ``strand = (ratios, weight)``, FGD-strand: the fragmentation
    decrease plus ``weight`` times the decrease of stranded GPU capacity, on FGD's scale."""

    def score_fgd(
        st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        assert st.fgd is not None
        count, small, total, frag = st.fgd
        # Most candidate nodes share a handful of states (empty nodes of one type, full ones):
        # score each distinct state once. The key is exact for integer states in practice.
        assert st.key is not None
        _, first, inv = np.unique(st.key[idx], return_index=True, return_inverse=True)
        rep = idx[first]
        before = frag[rep]
        if pod.is_share:
            free = st.gpu_free[rep]
            r, g = np.nonzero(free >= pod.milli)
            node = rep[r]
            after = share_candidates_fragmentation(
                count[node],
                small[node],
                total[node],
                st.cpu_free[node],
                free[r, g],
                classes,
                pod.milli,
                pod.cpu,
            )
            gain = before[r] - after
            if strand is not None:
                gain = gain + strand[1] * stranding_decrease(
                    free.sum(1)[r],
                    st.cpu_free[node],
                    st.mem_free[node],
                    pod.milli,
                    pod.cpu,
                    pod.mem,
                    strand[0],
                )
            s = np.full(free.shape, -1.0)
            s[r, g] = sigmoid_score(gain)
            gpu = np.argmax(s, axis=1)  # first best GPU, as the simulator's strict '>'
            return s[np.arange(rep.size), gpu][inv], gpu[inv]
        after1 = whole_fragmentation_from_terms(
            count[rep],
            small[rep],
            total[rep],
            st.cpu_free[rep],
            classes,
            pod.num_gpu,
            pod.cpu,
            MILLI_PER_GPU,
        )
        gain = before - after1
        if strand is not None:
            gain = gain + strand[1] * stranding_decrease(
                st.gpu_free[rep].sum(1),
                st.cpu_free[rep],
                st.mem_free[rep],
                pod.num_gpu * pod.milli,
                pod.cpu,
                pod.mem,
                strand[0],
            )
        return sigmoid_score(gain)[inv], np.full(idx.size, -1)

    return score_fgd


# Drawn for 64 slots (the pool model's widest node); the first 8 are the draws the replay
# always used (PCG64 draws in sequence), so its dedup keys are unchanged.
_KEY_WEIGHTS = np.random.default_rng(12345).random(64) * 1e3 + 1.0


_KEY_CPU = 1.0 / 7.0


_KEY_MEM = 1.0 / 1013.0


def state_key(st: NodeView, rows: slice | np.ndarray, with_mem: bool) -> np.ndarray:
    """FGD's dedup key of nodes ``rows``: GPU slots, CPU and (for FGD-strand) memory."""
    g = st.gpu_free[rows]
    key = g @ _KEY_WEIGHTS[: g.shape[-1]] + st.cpu_free[rows] * _KEY_CPU
    return np.asarray(key + st.mem_free[rows] * _KEY_MEM if with_mem else key)


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.trunc(100.0 / (1.0 + np.exp(-delta / MILLI_PER_GPU)))
    return np.where(np.isfinite(delta), s, -1.0)
