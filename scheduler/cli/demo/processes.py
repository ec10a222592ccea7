"""The demo's child processes: each in its own process group, stopped on exit, Ctrl-C or error."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ProcessGroup", "snugfit_argv"]


_STOP_GRACE_S = 5.0


class ProcessGroup:
    """Child processes, each the leader of its own process group, stopped together.

    ``stop()`` sends SIGTERM to every group, waits, then SIGKILLs what is left; it is registered
    with ``atexit`` so an exception or Ctrl-C anywhere in the demo still cleans up.
    """

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._stopped = False
        atexit.register(self.stop)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        fh = log.open("ab")
        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: killpg reaches its children too
            )
        finally:
            fh.close()
        self.procs.append((name, proc))

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs if p.poll() is not None]

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for _, p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        for _, p in self.procs:
            # The group too: a worker's job subprocesses must not outlive it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=2.0)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)


def snugfit_argv(*args: str) -> list[str]:
    # The interpreter running the demo, not whatever `snugfit` is first on PATH.
    return [sys.executable, "-c", "from scheduler.cli import main; main()", *args]
