"""A real job: its command as argv under the exec shim, with NVML peak sampling.

The shim (:mod:`workers._shim`) leads the job's process group and is its subreaper, and it
dies with the worker (``PR_SET_PDEATHSIG``), killing the whole job tree as it goes: a
``kill -9`` of the worker leaves no job process running, grandchildren included.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
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


SHIM_PATH = str(Path(__file__).with_name("_shim.py"))
#: How long the shim may take to report that the job started (Python start-up, busy node).
_SHIM_START_TIMEOUT_S = 60.0


class ProcessRun:
    """A real command: argv, its own process group, output to a file, NVML peak sampling."""

    simulated = False

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        nvml: Nvml | None,
        indices: list[int],
        *,
        workdir: str | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self.argv = argv
        self.env = env
        self.workdir = workdir
        self.grace_s = grace_s
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
        """Start the shim, which starts the job; OSError (with the job's errno) if it cannot."""
        if self.workdir is not None and not os.path.isdir(self.workdir):
            self.close()
            raise FileNotFoundError(2, f"workdir {self.workdir!r} is not a directory here")
        self.t0 = time.monotonic()
        read_fd, write_fd = os.pipe()
        try:
            # Started from the worker's main thread: PR_SET_PDEATHSIG fires when the *thread*
            # that forked the shim exits, and the main thread lives as long as the worker.
            self.proc = subprocess.Popen(
                [*_shim_argv(write_fd, self.grace_s), *self.argv],
                stdout=self._out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        except OSError:
            os.close(read_fd)
            self.close()
            raise
        finally:
            os.close(write_fd)
        try:
            line = _read_line(read_fd, _SHIM_START_TIMEOUT_S)
        finally:
            os.close(read_fd)
        if not line.startswith("ok "):
            self.proc.wait()
            self.close()
            _, _, rest = line.partition(" ")
            code, _, message = rest.partition(" ")
            raise OSError(int(code) if code.isdigit() else 0, message or "the job shim failed")
        if self._sampler is not None:
            self._sampler.start()

    def wait(self, timeout_s: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to the job (through the shim), SIGKILL to all of it ``grace_s`` later."""
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return
        # The shim forwards SIGTERM to the job's tree and kills what is left after its grace
        # (the ProcessRun's, which a time limit or cancel shares); SIGHUP makes it kill now.
        for sig, wait_s in (
            (signal.SIGTERM, max(grace_s, self.grace_s) + 2.0),
            (signal.SIGHUP, 3.0),
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
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


def _shim_argv(status_fd: int, grace_s: float) -> list[str]:
    # -I -S: the shim imports nothing from the job's environment or site-packages.
    shim = [sys.executable, "-I", "-S", SHIM_PATH]
    return [*shim, str(status_fd), str(os.getpid()), repr(float(grace_s)), "--"]


def _read_line(fd: int, timeout_s: float) -> str:
    """One line from the shim's status pipe ('' if it closed or stayed silent)."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode("utf-8", "replace").strip()
