"""Lookahead (ours): place each job where it lowers the expected waste of the cluster most,
judged over the next arrivals of the workload's mix rather than the next one.

Two terms, both in GPU capacity (milli-GPU on openb):

- the decrease of the chosen GPU gaps' *waste-to-go*, the capacity a gap is expected to keep
  after ``arrivals`` more arrivals of the mix (:mod:`scheduler.policies._lookahead_maths`);
- ``weight`` times the decrease of stranded GPU capacity, the GPUs the mix's CPU and memory per
  GPU will leave unusable on the node (:mod:`scheduler.policies._stranding_maths`, as in
  FGD-strand).

FGD (Weng et al., ATC'23) asks whether the *next* task fits each GPU; a 530 milli-GPU gap beside a
470 share fails most next tasks and looks fragmented, yet the mix closes it with the next 470,
while the 190 gap beside an 810 share fits almost nothing the mix brings and stays empty.
Looking several arrivals ahead tells the two apart; on openb this is what is left unallocated
once CPU stranding is handled (FGD-strand). A whole GPU taken lowers the waste-to-go by that of a
full GPU; a CPU-only job changes only the stranding term. Equal gains go to the node order.

It is online: each job is placed before the next one is seen. The mix is given (``sizes`` and
``ratios``: the openb replay passes the pod list's, as it passes FGD its target workload) or read
from the queued and running jobs at each call, as the live ``fgd`` policy reads its target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from scheduler.exceptions import PolicyError
from scheduler.policies._lookahead_maths import (
    DEFAULT_LOOKAHEAD_ARRIVALS,
    per_gpu_sizes,
    waste_to_go,
)
from scheduler.policies._node_scorers import (
    MILLI_PER_GPU,
    NodeView,
    PodShape,
    Scorer,
    state_key,
)
from scheduler.policies._stranding_maths import DemandRatios, demand_ratios, stranding_decrease
from scheduler.policies.node_score import NodeScorePolicy, _pod_shapes
from scheduler.policies.registry import PolicyName

if TYPE_CHECKING:
    from scheduler.core.pool import Pool
    from scheduler.core.requests import PlacementRequest, RunningJob
    from scheduler.core.state import PoolState

__all__ = [
    "LOOKAHEAD_STRANDING_WEIGHT",
    "LookaheadPolicy",
    "lookahead_for_mix",
    "make_lookahead",
    "mix_waste_to_go",
]

#: Weight of the stranded-capacity decrease against the waste-to-go decrease (both milli-GPU).
#: Chosen on openb `default` with three seeds in exploratory runs, where weights 1, 2, 4 and 8
#: came within 0.02 points of each other: not a fine-tuned constant.
LOOKAHEAD_STRANDING_WEIGHT = 4.0


def mix_waste_to_go(
    num_gpu: np.ndarray, per_gpu_milli: np.ndarray, arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS
) -> np.ndarray:
    """Waste-to-go of every gap 0..1000 milli-GPU for a mix of tasks (GPUs per task, milli-GPU
    per GPU; 0 GPUs = a CPU-only task)."""
    sizes = per_gpu_sizes(num_gpu, np.rint(per_gpu_milli).astype(np.int64), MILLI_PER_GPU)
    return waste_to_go(sizes, arrivals, MILLI_PER_GPU)


def make_lookahead(
    ratios: DemandRatios, value: np.ndarray, weight: float = LOOKAHEAD_STRANDING_WEIGHT
) -> Scorer:
    """The node scorer (module docstring): the waste-to-go decrease ``value[f] - value[f - s]``
    of the GPU a share takes (the best GPU of each node) or ``value[full]`` per whole GPU, plus
    ``weight`` times the stranding decrease. Scores are the gains themselves; ``st.key`` must
    be :func:`~scheduler.policies._node_scorers.state_key` with memory (equal keys, equal
    scores)."""

    def score(
        st: NodeView, idx: np.ndarray, pod: PodShape, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        assert st.key is not None
        # Score each distinct node state once (most candidates are empty or alike).
        _, first, inv = np.unique(st.key[idx], return_index=True, return_inverse=True)
        rep = idx[first]
        gpu_total = st.gpu_free[rep].sum(1)
        if pod.is_share:
            free = st.gpu_free[rep]
            r, g = np.nonzero(free >= pod.milli)
            left = free[r, g]
            gain = value[left] - value[left - pod.milli]
            gain = gain + weight * stranding_decrease(
                gpu_total[r],
                st.cpu_free[rep][r],
                st.mem_free[rep][r],
                pod.milli,
                pod.cpu,
                pod.mem,
                ratios,
            )
            s = np.full(free.shape, -np.inf)
            s[r, g] = gain
            gpu = np.argmax(s, axis=1)  # the first best GPU
            return s[np.arange(rep.size), gpu][inv], gpu[inv]
        gain = weight * stranding_decrease(
            gpu_total,
            st.cpu_free[rep],
            st.mem_free[rep],
            pod.num_gpu * pod.milli,
            pod.cpu,
            pod.mem,
            ratios,
        )
        if pod.num_gpu > 0:
            gain = gain + pod.num_gpu * float(value[-1])  # each whole GPU: full gap to none
        return np.asarray(gain)[inv], np.full(idx.size, -1)

    return score


def lookahead_for_mix(
    cpu: np.ndarray,
    mem: np.ndarray,
    num_gpu: np.ndarray,
    per_gpu_milli: np.ndarray,
    arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS,
) -> Scorer:
    """The scorer for a mix of tasks (CPU, memory, GPUs, milli-GPU per GPU of each). A mix
    without GPU tasks yet (the first arrivals, when learning online) strands nothing."""
    num_gpu = np.asarray(num_gpu)
    ratios = (
        demand_ratios(cpu, mem, num_gpu, per_gpu_milli)
        if ((num_gpu > 0) & (np.asarray(per_gpu_milli) > 0)).any()
        else DemandRatios(0.0, 0.0)
    )
    return make_lookahead(ratios, mix_waste_to_go(num_gpu, per_gpu_milli, arrivals))


class LookaheadPolicy(NodeScorePolicy):
    """The lookahead scorer as a live policy (module docstring).

    ``sizes`` (per-GPU milli-GPU per task of the mix, :func:`per_gpu_sizes`) and ``ratios``
    (its CPU and memory per GPU) fix the arrival mix; either left out is read from the queue and
    the running jobs at each call. ``arrivals`` is the look-ahead depth.
    """

    name = PolicyName.LOOKAHEAD
    score_label = "lookahead score"

    def __init__(
        self,
        *,
        seed: int | None = None,
        node_rank: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
        sizes: np.ndarray | None = None,
        ratios: DemandRatios | None = None,
        arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS,
        weight: float = LOOKAHEAD_STRANDING_WEIGHT,
    ) -> None:
        if not (math.isfinite(weight) and weight >= 0):
            raise PolicyError(f"lookahead: weight must be a finite number >= 0; got {weight!r}")
        if isinstance(arrivals, bool) or not isinstance(arrivals, int) or arrivals < 0:
            raise PolicyError(f"lookahead: arrivals must be a whole number >= 0; got {arrivals!r}")
        super().__init__(seed=seed, node_rank=node_rank, rng=rng)
        self.ratios = ratios
        self.arrivals = arrivals
        self.weight = float(weight)
        self._value = (
            None if sizes is None else waste_to_go(np.asarray(sizes), arrivals, MILLI_PER_GPU)
        )

    def scorer(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> Scorer:
        ratios, value = self.ratios, self._value
        if ratios is None or value is None:
            cpu, mem, num, milli = _pod_shapes(pending, running, pool)
            if num.size == 0:
                raise PolicyError(
                    "lookahead: no queued or running job to take the arrival mix from; pass "
                    "sizes= and ratios="
                )
            if ratios is None:
                ratios = demand_ratios(cpu, mem, num, milli)
            if value is None:
                value = mix_waste_to_go(num, milli, self.arrivals)
        return make_lookahead(ratios, value, self.weight)

    def prepare(self, view: NodeView) -> None:
        view.key = state_key(view, slice(None), True)

    def refresh(self, view: NodeView, state: PoolState, k: int) -> None:
        super().refresh(view, state, k)
        assert view.key is not None
        view.key[k] = state_key(view, slice(k, k + 1), True)[0]
