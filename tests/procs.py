"""Real snugfit processes in tests: waiting on a condition, and stopping what a test started."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

#: The processes a test started: the ``procs`` fixture's list, stopped when the test ends.
Procs = list[subprocess.Popen[bytes]]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> None:
    """Poll ``cond`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    """SIGTERM every process still running, then reap each; one that outlives ``timeout`` is
    killed, so a stuck process never outlives its test."""
    started = list(procs)
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
