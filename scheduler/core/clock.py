"""Where "now" comes from: the wall clock in the service, a virtual clock in the simulator.

The scheduler core only ever asks a :class:`Clock` for the time, so the same code runs live and
in simulation without a ``simulate`` flag anywhere.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from scheduler.exceptions import SimulationError

__all__ = ["Clock", "SystemClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds; only differences and ordering matter to the scheduler."""
        ...


class SystemClock:
    """Wall-clock seconds since the Unix epoch, so timestamps in logs and Redis agree."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when the simulator moves it; it never goes backwards."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)

    def now(self) -> float:
        return self._now_s

    def advance_to(self, t_s: float) -> None:
        if t_s < self._now_s:
            raise SimulationError(
                f"virtual clock cannot go back from {self._now_s:.3f} s to {t_s:.3f} s; "
                "process events in time order"
            )
        self._now_s = float(t_s)

    def advance_by(self, dt_s: float) -> None:
        self.advance_to(self._now_s + dt_s)
