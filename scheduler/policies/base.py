"""The one interface every placement policy implements.

A policy sees the whole pending queue at once, so queue disciplines (FIFO, backfill), batch
optimisers (ILP) and per-job scorers (first-fit, best-fit, FGD, right-size) all fit behind
the same call. The core loop is shared by the live service and the simulator: each tick it
calls :meth:`Policy.schedule` and commits the returned decisions against the pool state.

Callers use :meth:`Policy.schedule`; a policy implements :meth:`Policy.decide`, which gets the
same four things as one :class:`Tick`, so no policy repeats the call's signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.core.decision import Decision
    from scheduler.core.options import OptionBatch
    from scheduler.core.requests import PlacementRequest, RunningJob
    from scheduler.core.state import PoolState
    from scheduler.policies.registry import PolicyName

__all__ = ["Policy", "Tick"]


@dataclass(frozen=True, slots=True)
class Tick:
    """What a policy decides on: the pending queue (in order), the pool state it commits to,
    the time, and the jobs running (with their predicted ends, for backfill).

    ``batch``, when the caller already built it, is the default-knob
    :class:`~scheduler.core.options.OptionBatch` of exactly ``pending`` on the state's pool
    (the core's, when the queue is the tick's new jobs): a policy that enumerates with default
    knobs may use it instead of building its own (:func:`scheduler.policies._each.place_each`).
    """

    pending: Sequence[PlacementRequest]
    state: PoolState
    now_s: float
    running: Sequence[RunningJob] = ()
    batch: OptionBatch | None = None


class Policy(ABC):
    name: PolicyName

    def schedule(
        self,
        pending: Sequence[PlacementRequest],
        state: PoolState,
        now_s: float,
        running: Sequence[RunningJob] = (),
        batch: OptionBatch | None = None,
    ) -> list[Decision]:
        """Decide for every pending job, in queue order.

        Returns one Decision per pending job: ``placed`` (the chosen option is committed to
        ``state`` before the next job is considered, so decisions in one call never overlap),
        ``pending`` (waits, with the reason) or ``rejected`` (fits nowhere even on an empty
        pool). ``state`` is mutated by placed decisions; callers that must not see that pass
        a copy. ``batch``: see :class:`Tick`.
        """
        return self.decide(Tick(pending, state, now_s, running, batch))

    @abstractmethod
    def decide(self, tick: Tick) -> list[Decision]:
        """What :meth:`schedule` returns, for the queue, state, time and running jobs of
        ``tick``; same contract."""
