"""FGD-lookahead (ours): FGD-strand plus the decrease of the chosen GPUs' waste-to-go.

FGD scores a placement by how much it lowers the node's fragmentation against the *next*
task of the target workload; FGD-strand (:class:`~scheduler.policies.node_score.FgdStrandPolicy`)
adds the GPUs that the mix's CPU and memory per GPU will strand. Both still judge a GPU's gap
by one arrival. This policy adds, with weight ``lookahead_weight``, the decrease of the gap's
expected waste after ``arrivals`` arrivals of the same mix
(:mod:`scheduler.policies._lookahead_maths`): a 320 share that would leave a 210 gap beside a
470 (fillable by almost nothing the mix brings) loses against a gap that the mix will close, and
an 810 share is steered to a GPU a small share already uses.

It is online: each job is placed before the next one is seen. The mix is the target workload
FGD uses: given (``sizes``, the openb replay passes the pod list's shapes as it does for FGD's
classes) or read from the queued and running jobs at each call.
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
from scheduler.policies._node_scorers import MILLI_PER_GPU, Scorer, make_fgd
from scheduler.policies._stranding_maths import DemandRatios, demand_ratios
from scheduler.policies.fgd import TaskClasses
from scheduler.policies.node_score import FgdStrandPolicy, _pod_shapes
from scheduler.policies.registry import PolicyName

if TYPE_CHECKING:
    from scheduler.core.pool import Pool
    from scheduler.core.requests import PlacementRequest, RunningJob
    
__all__ = [
    "LOOKAHEAD_STRANDING_WEIGHT",
    "LOOKAHEAD_WEIGHT",
    "FgdLookaheadPolicy",
    "lookahead_scorer",
    "mix_waste_to_go",
]

#: Weight of the waste-to-go decrease, on FGD's milli-GPU scale (1 = one milli-GPU of expected
#: waste counts as one of fragmentation).
LOOKAHEAD_WEIGHT = 1.0

#: Weight of the stranded-capacity term (FGD-strand's, tuned with the look-ahead on).
LOOKAHEAD_STRANDING_WEIGHT = 4.0


def mix_waste_to_go(
    num_gpu: np.ndarray, per_gpu_milli: np.ndarray, arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS
) -> np.ndarray:
    """Waste-to-go per gap of 0..1000 milli-GPU for a mix of tasks (GPUs each, milli-GPU per
    GPU; 0 GPUs = CPU-only)."""
    sizes = per_gpu_sizes(num_gpu, np.rint(per_gpu_milli).astype(np.int64), MILLI_PER_GPU)
    return waste_to_go(sizes, arrivals, MILLI_PER_GPU)


def lookahead_scorer(
    classes: TaskClasses,
    ratios: DemandRatios,
    value: np.ndarray,
    *,
    weight: float = LOOKAHEAD_STRANDING_WEIGHT,
    lookahead_weight: float = LOOKAHEAD_WEIGHT,
) -> Scorer:
    """The FGD-lookahead node scorer: FGD's fragmentation decrease against ``classes``, plus
    ``weight`` times the stranded-capacity decrease (``ratios``), plus ``lookahead_weight``
    times the waste-to-go decrease (``value``, :func:`waste_to_go`), scored exactly (only equal
    gains tie: the look-ahead term separates what the integer score would lump together)."""
    return make_fgd(classes, (ratios, weight), (value, lookahead_weight), exact=True)


class FgdLookaheadPolicy(FgdStrandPolicy):
    """FGD-strand plus ``lookahead_weight`` times the waste-to-go decrease (module docstring).

    ``sizes`` fixes the arrival mix's per-GPU sizes in milli-GPU (one per task,
    :func:`~scheduler.policies._lookahead_maths.per_gpu_sizes`); else it is read from the
    queue and the running jobs, like FGD's target workload.
    """

    name = PolicyName.FGD_LOOKAHEAD
    score_label = "FGD-lookahead score"

    def __init__(
        self,
        *,
        seed: int | None = None,
        node_rank: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
        classes: TaskClasses | None = None,
        ratios: DemandRatios | None = None,
        weight: float = LOOKAHEAD_STRANDING_WEIGHT,
        sizes: np.ndarray | None = None,
        arrivals: int = DEFAULT_LOOKAHEAD_ARRIVALS,
        lookahead_weight: float = LOOKAHEAD_WEIGHT,
    ) -> None:
        if not (math.isfinite(lookahead_weight) and lookahead_weight >= 0):
            raise PolicyError(
                f"fgdlookahead: lookahead_weight must be a finite number >= 0; got "
                f"{lookahead_weight!r}"
            )
        if isinstance(arrivals, bool) or not isinstance(arrivals, int) or arrivals < 0:
            raise PolicyError(
                f"fgdlookahead: arrivals must be a whole number >= 0; got {arrivals!r}"
            )
        super().__init__(
            seed=seed, node_rank=node_rank, rng=rng, classes=classes, ratios=ratios, weight=weight
        )
        self.arrivals = arrivals
        self.lookahead_weight = float(lookahead_weight)
        self._value = (
            None if sizes is None else waste_to_go(np.asarray(sizes), arrivals, MILLI_PER_GPU)
        )

    def scorer(
        self, pending: Sequence[PlacementRequest], running: Sequence[RunningJob], pool: Pool
    ) -> Scorer:
        self._active = self.target(pending, running, pool)
        ratios, value = self.ratios, self._value
        if ratios is None or value is None:
            cpu, mem, num, milli = _pod_shapes(pending, running, pool)
            if ratios is None:
                ratios = demand_ratios(cpu, mem, num, milli)
            if value is None:
                value = mix_waste_to_go(num, milli, self.arrivals)
        return lookahead_scorer(
            self._active,
            ratios,
            value,
            weight=self.weight,
            lookahead_weight=self.lookahead_weight,
        )
