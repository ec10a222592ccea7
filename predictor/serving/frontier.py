"""Latency–throughput frontier of each option of a plan (the data behind issue 15's chart).

For one option, sweep the per-replica request rate from light load to saturation and record
output tokens/s per GPU against p95 TPOT and TTFT: the curve a team reads to see how much
latency each extra token/s costs on that GPU type.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._engines import PREFILL_CHUNK_TOKENS
from ._queueing import load_point, max_rate
from .planner import PlanOption, ServingPlan

__all__ = ["FrontierPoint", "frontier", "plan_frontiers"]

LOAD_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    load: float  # share of the replica's max request rate
    tok_s_per_gpu: float
    tpot_p95_s: float
    ttft_p95_s: float


def frontier(
    option: PlanOption, input_len: int, output_len: int, loads: tuple[float, ...] = LOAD_FRACTIONS
) -> list[FrontierPoint]:
    """Stable points of one option's frontier (points past the queueing limit are dropped)."""
    step = option.perf.iteration_s
    top = max_rate(step, option.max_batch, input_len, output_len)
    out = []
    for f in loads:
        p = load_point(step, f * top, option.max_batch, input_len, output_len, PREFILL_CHUNK_TOKENS)
        if p.stable:
            out.append(
                FrontierPoint(f, p.rate * output_len / option.n_gpus, p.tpot_p95_s, p.ttft_p95_s)
            )
    return out


def plan_frontiers(p: ServingPlan) -> dict[str, dict[str, object]]:
    """The frontier of the cheapest option meeting the SLO per GPU type (whole GPUs and MIG
    slices are separate types here), with its $ per 1M tokens at the planned rate."""
    spec = p.spec
    assert spec.input_len is not None and spec.output_len is not None
    best: dict[str, PlanOption] = {}
    for o in p.options:
        if o.meets_slo and o.where not in best:
            best[o.where] = o  # options are sorted cheapest first
    return {
        gpu: {
            "shape": o.shape.label,
            "usd_per_million_tokens": round(o.usd_per_million_tokens, 4),
            "points": [
                {
                    "load": pt.load,
                    "tok_s_per_gpu": round(pt.tok_s_per_gpu, 1),
                    "tpot_p95_s": round(pt.tpot_p95_s, 5),
                    "ttft_p95_s": round(pt.ttft_p95_s, 4),
                }
                for pt in frontier(o, spec.input_len, spec.output_len)
            ],
        }
        for gpu, o in best.items()
    }
