"""Latency of one continuous-batching replica under Poisson arrivals.

Steady state at ``rate`` requests/s (Little's law): the running batch is
``b = rate · output_len · τ̄``. Prompts arriving during a step start together in the next one
(chunked prefill, decode first, ``chunk_tokens`` per step), so a share ``1 − e^(−rate·τ̄)`` of
steps carries prompt chunks and is longer (compute-bound) than a decode-only step; ``τ̄`` is
the mean over that mix, solved by fixed-point iteration.

* TPOT p95: the step mix at the 95th percentile of the running set (Poisson, as in M/G/∞,
  capped at the KV-cache limit), plus the binomial spread of prefill steps over a request's
  ``output_len`` steps.
* TTFT p95: the p95 wait for the step in progress (length-biased mix) + the step carrying the
  prompt (with the prompts that arrived meanwhile) + the prefill queue (M/D/1, Kingman's
  exponential tail ``W_q ≈ s/(2(1−ρ))·ln(ρ/(1−q))``, ``s`` = the time a prompt adds to a step)
  + the wait for a free KV slot (Erlang C, ``c = max_batch``).
* Max throughput (the "max load" of trtllm-bench): the batch pinned at ``max_batch`` with
  prompts spread evenly over steps.

``predictor.serving._des`` runs the same replica as a discrete-event simulation;
``tests/predictor/serving/test_des.py`` holds the two to within 15% (TPOT) and 30% (TTFT).

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


@dataclass(frozen=True, slots=True)
class _StepMix:
    """Steps with prompt chunks (``share`` of them, ``tokens`` each) among decode-only steps."""

    share: float
    chunks: int
    tokens: float

    def mean(self, step: StepFn, batch: float, ctx: float) -> float:
        return (1.0 - self.share) * step(batch, ctx, 0.0) + self.share * step(
            batch, ctx, self.tokens
        )


def _mix(arrivals_per_step: float, input_len: int, budget: float) -> _StepMix:
    """Prompts arriving during a step (Poisson) all start in the next one, split into chunks of
    at most ``budget`` tokens: a whole prompt per step at light load (a long, compute-bound
    step), an even spread at heavy load."""
    n = max(arrivals_per_step, 0.0)
    busy = -math.expm1(-n)  # share of steps that have at least one new prompt
    if busy <= 1e-12:
        return _StepMix(0.0, 1, float(input_len))
    tokens = n / busy * input_len
    chunks = max(1, math.ceil(tokens / budget))
    return _StepMix(min(1.0, busy * chunks), chunks, tokens / chunks)


def _residual_p95(prefill_time_share: float, t_dec: float, t_pre: float) -> float:
    """p95 of the wait for the step in progress to end, arriving at a random time."""
    w = min(max(prefill_time_share, 0.0), 1.0)
    x = _Q / (w / t_pre + (1.0 - w) / t_dec)
    if x <= t_dec:
        return x
    return (_Q - (1.0 - w)) * t_pre / w if w > 1.0 - _Q else t_dec


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
    budget = float(chunk_tokens)
    tau, running = step(1.0, ctx, 0.0), 1.0
    mix = _StepMix(0.0, 1, 0.0)
    for _ in range(60):
        running = min(float(max_batch), max(rate * output_len * tau, 0.0))
        mix = _mix(rate * tau, input_len, max(budget - running, 0.25 * budget))
        new = mix.mean(step, max(running, 1.0), ctx)
        if abs(new - tau) <= 1e-9 + 1e-6 * tau:
            tau = new
            break
        tau = new
    b95 = min(float(max_batch), max(1.0, poisson_quantile(running)))
    t_dec, t_pre = step(b95, ctx, 0.0), step(b95, ctx, mix.tokens)
    q = mix.share
    # A request's mean TPOT averages `output_len` steps, a binomial share of them prefill steps.
    spread = 1.6449 * math.sqrt(q * (1.0 - q) / output_len) * (t_pre - t_dec)
    tpot95 = (1.0 - q) * t_dec + q * t_pre + spread

    # Prefill server: prompts share the step's token budget left over by the decode batch
    # (chunked prefill, decode first). A prompt occupies `input_len / budget` of a step.
    left = max(budget - running, 0.25 * budget)
    chunks = max(1, math.ceil(input_len / left))
    # Its work is the time it adds to a step (compute-bound prefill), at least its budget share.
    service = max(step(b95, ctx, float(input_len)) - t_dec, input_len * t_pre / left)
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
    residual = _residual_p95(q * t_pre / max(tau, 1e-12), t_dec, t_pre)
    # The prompt's step also carries every prompt that arrived during the step in progress
    # (ahead of it in FIFO order or behind it within the budget): 1 + rate × step length.
    own_tokens = (1.0 + rate * max(residual, t_pre)) * input_len
    own = step(b95, ctx, min(own_tokens, left))
    ttft95 = residual + chunks * own + wait_prefill + wait_slot
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
