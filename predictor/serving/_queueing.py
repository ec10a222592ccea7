"""Latency of one continuous-batching replica under Poisson arrivals.

Steady state at ``rate`` requests/s (Little's law): the running batch is
``b = rate · output_len · τ`` where ``τ`` is the iteration time with ``b`` decoding sequences
and the ``rate · τ · input_len`` prompt tokens that arrive per iteration (chunked prefill fuses
them into the same step). Solved by fixed-point iteration.

* TPOT p95: the running set of an M/G/∞ system is Poisson with mean ``b``; the step time at its
  95th percentile (capped at the KV-cache limit) bounds the per-request mean TPOT.
* TTFT p95: the wait for the running step to end + the steps carrying the prompt's own chunks +
  the wait for the prefill server (the step's token budget left by the decode batch, an M/D/1
  queue with Kingman's exponential tail ``W_q ≈ s/(2(1−ρ))·ln(ρ/(1−q))``) + the wait for a
  free KV slot (Erlang C with ``c = max_batch`` servers).
* Max throughput (the "max load" of trtllm-bench): the batch pinned at ``max_batch``.

All functions are pure; the step time comes in as a callable, so any runtime model plugs in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "LoadPoint",
    "load_point",
    "max_rate",
    "poisson_quantile",
    "rate_at_slo",
    "throughput_at_concurrency",
]

#: ``step(decode_seqs, mean_ctx, prefill_tokens) -> seconds``
StepFn = Callable[[float, float, float], float]
_Q = 0.95


@dataclass(frozen=True, slots=True)
class LoadPoint:
    rate: float  # requests/s into this replica
    running: float  # mean running batch
    step_s: float  # mean iteration time
    ttft_p95_s: float
    tpot_p95_s: float
    stable: bool


def poisson_quantile(mean: float, q: float = _Q) -> float:
    """Smallest k with P(Poisson(mean) ≤ k) ≥ q (normal approximation above mean 50)."""
    if mean <= 0:
        return 0.0
    if mean > 50:
        return mean + 1.6449 * math.sqrt(mean)
    term = math.exp(-mean)
    cdf, k = term, 0
    while cdf < q:
        k += 1
        term *= mean / k
        cdf += term
    return float(k)


def _erlang_c(servers: int, load: float) -> float:
    """Probability an arrival waits in M/M/c with offered load ``load`` (Erlangs)."""
    if load >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    rho = load / servers
    return b / (1.0 - rho * (1.0 - b))


def max_rate(step: StepFn, max_batch: int, input_len: int, output_len: int) -> float:
    """Requests/s one replica sustains with its batch pinned at ``max_batch``."""
    ctx = input_len + output_len / 2.0
    tau = step(max_batch, ctx, max_batch * input_len / output_len)
    return max_batch / (output_len * tau)


def throughput_at_concurrency(
    step: StepFn, concurrency: int, max_batch: int, input_len: int, output_len: int
) -> float:
    """Output tokens/s of a closed loop of ``concurrency`` clients (benchmark "users").

    Clients beyond ``max_batch`` queue, so the engine runs at ``min(concurrency, max_batch)``.
    Each request pays its prefill once: per request ``output_len`` steps plus one prompt's
    worth of prefill tokens spread over them.
    """
    b = float(min(concurrency, max_batch))
    ctx = input_len + output_len / 2.0
    tau = step(b, ctx, b * input_len / output_len)
    return b / tau


def load_point(
    step: StepFn,
    rate: float,
    max_batch: int,
    input_len: int,
    output_len: int,
    chunk_tokens: int = 8192,
) -> LoadPoint:
    """Mean batch, step time and p95 TTFT/TPOT at ``rate`` requests/s into one replica."""
    ctx = input_len + output_len / 2.0
    cap = max_rate(step, max_batch, input_len, output_len)
    if rate >= cap:
        return LoadPoint(rate, float(max_batch), math.inf, math.inf, math.inf, False)
    tau = step(1.0, ctx, 0.0)
    running = 1.0
    for _ in range(60):
        running = min(float(max_batch), max(rate * output_len * tau, 0.0))
        new = step(max(running, 1.0), ctx, rate * tau * input_len)
        if abs(new - tau) <= 1e-9 + 1e-6 * tau:
            tau = new
            break
        tau = new
    b95 = min(float(max_batch), max(1.0, poisson_quantile(running)))
    tpot95 = step(b95, ctx, rate * tau * input_len)

    # Prefill server: prompts share the step's token budget left over by the decode batch
    # (chunked prefill, decode first). A prompt occupies `input_len / budget` of a step.
    budget = max(float(chunk_tokens) - running, 0.25 * chunk_tokens)
    chunks = max(1, math.ceil(input_len / budget))
    service = input_len * tau / budget
    rho = rate * service
    if rho >= 1.0:
        return LoadPoint(rate, running, tau, math.inf, tpot95, False)
    wait_prefill = (
        0.5 * service / (1.0 - rho) * math.log(rho / (1.0 - _Q)) if rho > 1.0 - _Q else 0.0
    )
    # KV slots: M/M/c with c = max_batch and holding time = output_len steps.
    hold = output_len * tau + chunks * tau
    load = rate * hold
    wait_slot = 0.0
    if load >= max_batch:
        return LoadPoint(rate, running, tau, math.inf, tpot95, False)
    if load > 0.5 * max_batch:
        c_wait = _erlang_c(max_batch, load)
        if c_wait > 1.0 - _Q:
            wait_slot = math.log(c_wait / (1.0 - _Q)) / (max_batch / hold - rate)
    own = step(b95, ctx, rate * tau * input_len + min(float(input_len), budget))
    # p95 of the wait for the running step to end (uniform over one step) + own chunks.
    ttft95 = _Q * tau + chunks * own + wait_prefill + wait_slot
    return LoadPoint(rate, running, tau, ttft95, tpot95, True)


def rate_at_slo(
    step: StepFn,
    max_batch: int,
    input_len: int,
    output_len: int,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
    chunk_tokens: int = 8192,
) -> float:
    """Largest requests/s one replica takes with p95 TTFT and TPOT within the targets (0 when
    even a trickle of traffic misses them)."""

    def ok(rate: float) -> bool:
        p = load_point(step, rate, max_batch, input_len, output_len, chunk_tokens)
        return (
            p.stable
            and (slo_ttft_s is None or p.ttft_p95_s <= slo_ttft_s)
            and (slo_tpot_s is None or p.tpot_p95_s <= slo_tpot_s)
        )

    hi = max_rate(step, max_batch, input_len, output_len)
    lo = hi * 1e-6
    if not ok(lo):
        return 0.0
    if ok(hi * 0.999):
        return hi * 0.999
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.002:
            break
    return lo
