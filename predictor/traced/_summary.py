"""From a trace's timeline to per-rank peaks: sharding, the allocator model, the breakdown.

The trace runs one unsharded rank. Multi-GPU jobs are sharded **arithmetically** from it, per
category, before the allocator replay (so rounding and segments see per-rank sizes):

* weights ÷ (TP·PP), and ÷ DP under ZeRO-3 plus two layers' gather buffers; under PP the
  heaviest stage holds a whole embedding table (input or head), not embeddings ÷ PP;
* gradients ÷ (TP·PP), and ÷ DP from ZeRO-2; optimizer states ÷ (TP·PP), ÷ DP from ZeRO-1;
  the unsharded flat gradients FSDP keeps while accumulating under ``no_sync`` (``_fsdp.py``)
  ÷ (TP·PP) only, shown as gradients; under ZeRO-3/FSDP the root unit's parameters, which
  FSDP keeps unsharded from forward to the end of backward, 1 − 1/DP of them, as weights;
* activations ÷ TP, and in training × min(PP, grad. accumulation) / PP (1F1B keeps that
  many micro-batches of its layers in flight; inference keeps one layer's working set, the
  same on every stage); logits ÷ TP; the KV cache ÷ (TP·PP).

No fake process group is traced: the TP collectives' buffers are not modelled (NCCL's own
buffers are added as overhead, as in the analytical tier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..prediction import BREAKDOWN_KEYS
from ..spec import JobSpec
from ._allocator import CachingAllocator
from ._fsdp import ROOT, UNSHARDED

__all__ = ["CATEGORIES", "TraceSummary", "shard_factors", "summarise"]

GIB = float(1 << 30)
# The traced categories: the contract's breakdown keys but ``overhead``, which no trace sees
# (the CUDA context and NCCL buffers are added afterwards, in _api.py).
CATEGORIES: tuple[str, ...] = tuple(k for k in BREAKDOWN_KEYS if k != "overhead")
#: Traced categories shown under another breakdown key (sharded by their own factor).
_SHOWN_AS = {UNSHARDED: "gradients", ROOT: "weights"}


@dataclass(frozen=True)
class TraceSummary:
    """Per-rank peaks of one traced job (GiB); ``breakdown_gib`` sums to ``allocated_gib``."""

    allocated_gib: float
    reserved_gib: float
    breakdown_gib: dict[str, float]
    peak_phase_index: int
    n_events: int
    flops: dict[str, float]
    bytes: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated_gib": self.allocated_gib,
            "reserved_gib": self.reserved_gib,
            "breakdown_gib": self.breakdown_gib,
            "peak_event": self.peak_phase_index,
            "n_events": self.n_events,
            "flops": self.flops,
            "bytes": self.bytes,
        }


def shard_factors(spec: JobSpec) -> dict[str, float]:
    """Per-category size factor of one rank relative to the unsharded trace."""
    tp, pp, dp = spec.tensor_parallel, spec.pipeline_parallel, spec.data_parallel
    zero = spec.zero_stage or 0 if spec.task.is_training else 0
    ga = spec.gradient_accumulation or 1
    # Training saves every layer's activations, so a stage holds its 1/PP of the layers for
    # min(PP, GA) micro-batches in flight. Inference saves nothing across layers: its
    # activations are one layer's working set (and a quantised layer's dequantised weight),
    # the same on every stage whatever its number of layers.
    in_flight = min(pp, ga) / pp if pp > 1 and spec.task.is_training else 1.0
    return {
        "weights": 1.0 / (tp * pp) / (dp if zero >= 3 else 1),
        "gradients": 1.0 / (tp * pp) / (dp if zero >= 2 else 1),
        UNSHARDED: 1.0 / (tp * pp),
        ROOT: (1.0 - 1.0 / dp) / (tp * pp) if zero >= 3 else 0.0,
        "optimizer": 1.0 / (tp * pp) / (dp if zero >= 1 else 1),
        "activations": in_flight / tp,
        "kv_cache": 1.0 / (tp * pp),
        "logits": 1.0 / tp,
    }


def summarise(
    events: list[tuple[int, int, int]],
    category: dict[int, str],
    spec: JobSpec,
    costs: dict[str, tuple[float, float]] | None = None,
    extra_weight_bytes: int = 0,
) -> TraceSummary:
    """Replay the sharded events through the allocator model; breakdown at the allocated peak."""
    factors = shard_factors(spec)
    alloc = CachingAllocator()
    if extra_weight_bytes:
        alloc.malloc(extra_weight_bytes)
    live: dict[int, Any] = {}
    sums = dict.fromkeys(CATEGORIES, 0)
    sums["weights"] = alloc.stats.allocated_bytes
    best = dict(sums)
    peak, peak_i = alloc.stats.allocated_bytes, -1
    for i, (op, h, n) in enumerate(events):
        cat = category.get(h, "activations")
        key = _SHOWN_AS.get(cat, cat)
        if op:
            if not factors[cat]:
                continue  # nothing on this rank (FSDP's root beyond its shard, unsharded)
            blk = alloc.malloc(max(1, int(n * factors[cat])))
            live[h] = blk
            sums[key] += blk.size
            if alloc.stats.allocated_bytes > peak:
                peak, peak_i = alloc.stats.allocated_bytes, i
                best = dict(sums)
        else:
            blk = live.pop(h, None)
            if blk is not None:
                sums[key] -= blk.size
                alloc.free(blk)
    c = costs or {}
    return TraceSummary(
        allocated_gib=alloc.stats.peak_allocated_bytes / GIB,
        reserved_gib=alloc.stats.peak_reserved_bytes / GIB,
        breakdown_gib={k: best[k] / GIB for k in CATEGORIES},
        peak_phase_index=peak_i,
        n_events=len(events),
        flops={k: v[0] for k, v in c.items()},
        bytes={k: v[1] for k, v in c.items()},
    )
