"""Backfill arithmetic: when could a job start if running jobs end as predicted, and where."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler.core._release import release_many
from scheduler.core.decision import Option
from scheduler.core.requests import RunningJob
from scheduler.core.state import PoolState
from scheduler.core.table import OptionTable

__all__ = ["Probe", "earliest_fit"]


Probe = Callable[[PoolState], tuple[OptionTable, int | None]]


def earliest_fit(
    state: PoolState,
    running: Sequence[RunningJob],
    now_s: float,
    probe: Probe,
    *,
    end_of: Callable[[RunningJob], float] = lambda r: r.predicted_end_s,
) -> tuple[float, Option] | None:
    """When a job could start if running jobs end as predicted, and on which (bound) option.

    ``probe`` returns the job's option table on a state and the policy's pick (or None).
    Releases running jobs in order of ``end_of`` and binary-searches the shortest prefix after
    which ``probe`` picks something (fitting only grows as jobs end). None if even releasing
    every running job does not help.
    """
    ends = sorted((r for r in running if r.job_id in state), key=end_of)

    def released(base: PoolState, jobs: Sequence[RunningJob]) -> PoolState:
        s = base.copy()
        release_many(s, [r.job_id for r in jobs])
        return s

    s = released(state, ends)
    table, idx = probe(s)
    if idx is None:
        return None
    lo, hi = 0, len(ends)
    best = (s, table, idx)
    # The state with ends[:lo] released (lo only grows): each probe releases from there, the
    # same releases in the same order as from ``state``, so a search releases each job about
    # twice instead of once per probe.
    base = state
    while lo < hi:
        mid = (lo + hi) // 2
        s = released(base, ends[lo:mid])
        table, idx = probe(s)
        if idx is not None:
            hi, best = mid, (s, table, idx)
        else:
            base = released(s, ends[mid : mid + 1])
            lo = mid + 1
    s, table, idx = best
    assert idx is not None
    t = now_s if lo == 0 else max(now_s, end_of(ends[lo - 1]))
    return t, table.option(idx, table.bind(idx, s))
