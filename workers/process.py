"""A real job: its command as argv in its own process group, with NVML peak sampling."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from scheduler.service.store.keys import LOG_CAP_BYTES
from workers.nvml import Nvml, PeakSampler
from workers.runner import RunResult

__all__ = ["NVML_OOM_FRACTION", "OOM_PATTERN", "ProcessRun", "detect_oom"]

OOM_PATTERN = re.compile(
    r"CUDA out of memory|torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|"
    r"CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
)
#: A failed run whose NVML peak reached this fraction of its limit is counted as an OOM.
NVML_OOM_FRACTION = 0.97
_GIB = float(1 << 30)


def detect_oom(
    output: str, exit_code: int | None, peak_gib: float | None, limit_gib: float
) -> bool:
    if exit_code == 0:
        return False
    if OOM_PATTERN.search(output):
        return True
    return peak_gib is not None and peak_gib >= NVML_OOM_FRACTION * limit_gib


def _pdeathsig() -> None:
    # The job dies with its worker (SIGKILL included), so a reclaimed job never runs twice.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ProcessRun:
    """A real command: argv, its own process group, output to a file, NVML peak sampling."""

    simulated = False

    def __init__(
        self, argv: list[str], env: dict[str, str], nvml: Nvml | None, indices: list[int]
    ) -> None:
        self.argv = argv
        self.env = env
        # Closed in close(): the file outlives this call (the job writes into it meanwhile).
        self._out = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="snugfit-job-", suffix=".log", delete=False
        )
        self._sampler = PeakSampler(nvml, indices) if nvml is not None and indices else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.t0 = 0.0
        self.runtime_s = 0.0
        self.stopped = False

    def start(self) -> None:
        self.t0 = time.monotonic()
        if self._sampler is not None:
            self._sampler.start()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
            preexec_fn=_pdeathsig,
        )

    def wait(self, timeout_s: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float = 5.0) -> None:
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output_tail(self) -> str:
        self._out.flush()
        path = Path(self._out.name)
        size = path.stat().st_size
        with path.open("rb") as fh:
            fh.seek(max(0, size - LOG_CAP_BYTES))
            return fh.read().decode("utf-8", "replace")

    def finish(self) -> tuple[int | None, int | None, float | None, float]:
        """(exit code, signal, peak GiB or None, runtime s)."""
        assert self.proc is not None
        code = self.proc.wait()
        self.runtime_s = time.monotonic() - self.t0
        peak = None
        if self._sampler is not None:
            got = self._sampler.stop()
            peak = None if got is None else got / _GIB / max(1, len(self._sampler.indices))
        sig = -code if code < 0 else None
        return (code if code >= 0 else None), sig, peak, self.runtime_s

    def result(self, limit_gib: float) -> RunResult:
        exit_code, sig, peak, runtime = self.finish()
        output = self.output_tail()
        self.close()
        # A run we stopped (cancel, lost lease) did not OOM, whatever its output says.
        oom = not self.stopped and detect_oom(output, exit_code, peak, limit_gib)
        return RunResult(exit_code, sig, peak, runtime, oom, output)

    def close(self) -> None:
        self._out.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._out.name)
