"""The continuous-batching queueing model on a synthetic step-time function."""

from __future__ import annotations

import math

import pytest

from predictor.serving._queueing import load_point, max_rate, poisson_quantile, rate_at_slo


def step(decode: float, ctx: float, prefill: float) -> float:
    # 20 ms of weight reads, 20 µs per decoding sequence, 10 µs per prefill token.
    return 0.020 + 2e-5 * decode + 1e-5 * prefill


def test_poisson_quantile() -> None:
    assert poisson_quantile(0.0) == 0.0
    assert poisson_quantile(1.0) == 3.0  # P(N <= 2) = 0.92, P(N <= 3) = 0.98
    assert poisson_quantile(400.0) == pytest.approx(400 + 1.6449 * 20)


def test_latency_rises_with_rate_and_breaks_at_capacity() -> None:
    cap = max_rate(step, 256, 512, 256)
    assert cap == pytest.approx(256 / (256 * step(256, 640, 512)))
    points = [load_point(step, cap * f, 256, 512, 256) for f in (0.05, 0.3, 0.6, 0.9)]
    assert all(p.stable for p in points)
    tpots = [p.tpot_p95_s for p in points]
    ttfts = [p.ttft_p95_s for p in points]
    assert tpots == sorted(tpots) and ttfts == sorted(ttfts)
    assert points[0].tpot_p95_s == pytest.approx(step(1, 640, 0), rel=0.2)
    over = load_point(step, cap * 1.01, 256, 512, 256)
    assert not over.stable and math.isinf(over.ttft_p95_s)


def test_littles_law_fixed_point() -> None:
    p = load_point(step, 20.0, 256, 512, 256)
    assert p.running == pytest.approx(20.0 * 256 * p.step_s, rel=1e-3)


def test_rate_at_slo_is_the_largest_rate_meeting_both_targets() -> None:
    r = rate_at_slo(step, 256, 512, 256, 0.5, 0.025)
    assert 0 < r < max_rate(step, 256, 512, 256)
    ok = load_point(step, r, 256, 512, 256)
    assert ok.tpot_p95_s <= 0.025 and ok.ttft_p95_s <= 0.5
    worse = load_point(step, r * 1.02, 256, 512, 256)
    assert worse.tpot_p95_s > 0.025 or worse.ttft_p95_s > 0.5
    assert rate_at_slo(step, 256, 512, 256, None, 0.019) == 0.0  # below the 20 ms floor
