"""A short discrete-event run of one continuous-batching replica (the Vidur approach).

It checks the closed-form queueing model of :mod:`._queueing` on the same step-time function:
Poisson arrivals, FIFO admission up to ``max_batch`` running sequences, and per step a token
budget of ``chunk_tokens`` shared decode-first (one token per decoding sequence) with prompt
chunks in arrival order, as vLLM's chunked-prefill scheduler does. A prompt's first token
appears at the end of the step that finishes its prefill; each later step adds one token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ._queueing import StepFn

__all__ = ["SimResult", "simulate_replica"]


@dataclass(frozen=True, slots=True)
class SimResult:
    ttft_p95_s: float
    tpot_p95_s: float  # p95 over requests of each request's mean time per output token
    mean_running: float
    completed: int


def simulate_replica(
    step: StepFn,
    rate: float,
    max_batch: int,
    input_len: int,
    output_len: int,
    *,
    n_requests: int = 2000,
    chunk_tokens: int = 8192,
    seed: int = 0,
    warmup_fraction: float = 0.1,
) -> SimResult:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    ctx = input_len + output_len / 2.0
    first = np.full(n_requests, np.nan)
    done = np.full(n_requests, np.nan)
    waiting: deque[int] = deque()
    # running: request id -> [prefill tokens left, output tokens left]
    running: dict[int, list[int]] = {}
    t, nxt, busy_area, busy_time = 0.0, 0, 0.0, 0.0
    while nxt < n_requests or waiting or running:
        if not waiting and not running:
            t = max(t, arrivals[nxt])
        while nxt < n_requests and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        while waiting and len(running) < max_batch:
            running[waiting.popleft()] = [input_len, output_len]
        decoding = [r for r, s in running.items() if s[0] == 0]
        budget = max(chunk_tokens - len(decoding), 0)
        prefill, finishing = 0, []
        for r, s in running.items():
            if s[0] == 0 or budget == 0:
                continue
            take = min(s[0], budget)
            s[0] -= take
            budget -= take
            prefill += take
            if s[0] == 0:
                finishing.append(r)
        dt = step(float(len(decoding)), ctx, float(prefill))
        t += dt
        busy_area += len(running) * dt
        busy_time += dt
        for r in finishing:
            first[r] = t
            running[r][1] -= 1
        for r in decoding:
            running[r][1] -= 1
        for r in [r for r, s in running.items() if s[0] == 0 and s[1] <= 0]:
            done[r] = t
            del running[r]
    keep = slice(int(n_requests * warmup_fraction), n_requests)
    ttft = (first - arrivals)[keep]
    tpot = ((done - first) / max(output_len - 1, 1))[keep]
    return SimResult(
        ttft_p95_s=float(np.nanpercentile(ttft, 95)),
        tpot_p95_s=float(np.nanpercentile(tpot, 95)),
        mean_running=busy_area / busy_time if busy_time else 0.0,
        completed=int(np.isfinite(done).sum()),
    )
