"""Clocks: the wall clock for the service, a virtual clock that only moves forward."""

from __future__ import annotations

import time

import pytest

from scheduler.core.clock import Clock, SystemClock, VirtualClock
from scheduler.exceptions import SimulationError


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(VirtualClock(), Clock)


def test_system_clock_is_wall_time() -> None:
    assert abs(SystemClock().now() - time.time()) < 5.0


def test_virtual_clock_moves_only_forward() -> None:
    clock = VirtualClock(10.0)
    assert clock.now() == 10.0
    clock.advance_to(12.5)
    clock.advance_by(0.5)
    assert clock.now() == 13.0
    clock.advance_to(13.0)  # standing still is fine
    with pytest.raises(SimulationError, match=r"cannot go back from 13\.000 s to 1\.000 s"):
        clock.advance_to(1.0)
