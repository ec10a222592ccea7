"""Default latency targets for ``serve`` specs that leave an SLO unset.

MLPerf Inference's *interactive* scenarios are the public reference for chat latency. The
Llama-2-70B interactive targets (TTFT 450 ms, TPOT 40 ms, p99 in MLPerf) are the ones quoted in
issue 15. The 8B and 405B-class tiers are the MLPerf Inference v5.x interactive targets for
Llama-3.1-8B (TTFT 0.5 s, TPOT 30 ms) and Llama-3.1-405B (TTFT 4.5 s, TPOT 80 ms), as recalled
from the MLPerf rules; they are not in ``../shared/validation``. Rule: a model takes the tier of
the nearest MLPerf model at or above its *active* parameter count (prefill and decode cost scale
with active, not total, parameters), and snugfit applies the targets at p95.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SloTier", "default_slo"]


@dataclass(frozen=True, slots=True)
class SloTier:
    name: str
    max_active_params_b: float
    ttft_s: float
    tpot_s: float


_TIERS: tuple[SloTier, ...] = (
    SloTier("MLPerf interactive, Llama-3.1-8B class", 15.0, 0.5, 0.030),
    SloTier("MLPerf interactive, Llama-2-70B class", 120.0, 0.45, 0.040),
    SloTier("MLPerf interactive, Llama-3.1-405B class", float("inf"), 4.5, 0.080),
)


def default_slo(active_params_b: float) -> SloTier:
    """The tier for a model with ``active_params_b`` billion parameters used per token."""
    for tier in _TIERS:
        if active_params_b <= tier.max_active_params_b:
            return tier
    return _TIERS[-1]
