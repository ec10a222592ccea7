"""The :class:`Runner` protocol: how a worker runs one attempt of a job.

Two implementations: :class:`workers.process.ProcessRun` (the job's command, for real) and
:class:`workers.simulated.SimulatedRun` (scaled time, labelled simulated everywhere). The
supervisor in :mod:`workers.execute` drives either the same way, so a simulated run obeys the
same rules as a real one (heartbeats, cancel, lost lease, OOM requeue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["RunResult", "Runner"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one attempt did. ``peak_vram_gib`` is per GPU; ``oom`` is already decided."""

    exit_code: int | None
    signal: int | None
    peak_vram_gib: float | None
    runtime_s: float
    oom: bool
    output: str


class Runner(Protocol):
    #: Whether the outcome is simulated; it labels the outcome, the events and the history.
    simulated: bool

    def start(self) -> None:
        """Start the attempt; OSError when its command cannot be started."""

    def wait(self, timeout_s: float) -> bool:
        """True once the attempt is over (finished or stopped)."""

    def stop(self, grace_s: float) -> None:
        """End the attempt early (cancel, lost lease); SIGKILL after ``grace_s`` if it must."""

    def output_tail(self) -> str | None:
        """The output so far (its last ``LOG_CAP_BYTES``), or None when there is none to show."""

    def result(self, limit_gib: float) -> RunResult:
        """The outcome of an attempt that is over; ``limit_gib`` is what it could allocate.
        Releases what the runner holds (output files)."""
