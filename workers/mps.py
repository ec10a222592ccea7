"""MPS on a shared node: one control daemon per GPU, and each client's limits.

CUDA MPS lets several processes share a GPU's SMs at once; a job on a shared slot is an MPS
client. The worker starts (or finds running) one ``nvidia-cuda-mps-control -d`` per GPU, each
with its own pipe and log directory under ``$SNUGFIT_HOME/mps/gpu<N>/`` and
``CUDA_VISIBLE_DEVICES`` set to that GPU, so a job's limits and a daemon's failure stay on one
GPU. Each client gets:

- ``CUDA_MPS_PIPE_DIRECTORY``: its GPU's daemon;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: its reservation (the pinned memory limit, CUDA >= 11.5);
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: its compute share, the same share the scheduler used
  to price the placement (:func:`scheduler.core.shares.shared_compute_share`).

Where a daemon cannot be started or does not answer, the node refuses work and says why.
Daemons this worker started are asked to quit when it stops.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from scheduler.core.shares import shared_compute_share

__all__ = ["MPS_CONTROL", "MpsDaemons", "thread_percentage"]

log = logging.getLogger("snugfit.worker.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
_ANSWER_TIMEOUT_S = 10.0
_START_TIMEOUT_S = 10.0


def thread_percentage(share: float) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a compute share in (0, 1]: rounded up, 1..100."""
    if not math.isfinite(share) or share <= 0:
        return 1
    return max(1, min(100, math.ceil(share * 100 - 1e-9)))


class MpsDaemons:
    """The MPS control daemons of one node's GPUs (NVML indices, with UUIDs where known)."""

    def __init__(
        self,
        home: Path,
        gpus: Sequence[int],
        uuids: dict[int, str] | None = None,
        binary: str = MPS_CONTROL,
        max_jobs: int = 1,
    ) -> None:
        self.home = Path(home) / "mps"
        self.max_jobs = max_jobs
        self.gpus = list(gpus)
        self.uuids = dict(uuids or {})
        self.binary = binary
        self.started: list[int] = []

    def pipe_dir(self, gpu: int) -> Path:
        return self.home / f"gpu{gpu}" / "pipe"

    def log_dir(self, gpu: int) -> Path:
        return self.home / f"gpu{gpu}" / "log"

    def _env(self, gpu: int) -> dict[str, str]:
        # The driver's own tool runs with the worker's environment (library paths), less
        # snugfit's secrets, and sees only its GPU.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNUGFIT_")}
        return env | {
            "CUDA_VISIBLE_DEVICES": self.uuids.get(gpu, str(gpu)),
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu)),
        }

    def _control(self, gpu: int, command: str) -> subprocess.CompletedProcess[str] | None:
        path = shutil.which(self.binary)
        if path is None:
            return None
        try:
            return subprocess.run(
                [path],
                input=command + "\n",
                capture_output=True,
                text=True,
                env=self._env(gpu),
                timeout=_ANSWER_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess([path], 1, "", str(exc))

    def answers(self, gpu: int) -> bool:
        """Whether GPU ``gpu``'s daemon is running and answers on its pipe."""
        if not (self.pipe_dir(gpu) / "control").exists():
            return False
        got = self._control(gpu, "get_default_active_thread_percentage")
        return got is not None and got.returncode == 0

    def ensure(self) -> list[str]:
        """Start or verify every GPU's daemon; the problems found (empty: MPS is ready)."""
        if shutil.which(self.binary) is None:
            return [
                f"MPS: `{self.binary}` is not on PATH; install the NVIDIA driver utilities "
                "(MPS ships with the driver) or run the node in whole/MIG mode"
            ]
        problems = []
        for gpu in self.gpus:
            why = self._ensure_one(gpu)
            if why:
                problems.append(f"MPS on GPU {gpu}: {why}")
        return problems

    def _ensure_one(self, gpu: int) -> str:
        if self.answers(gpu):
            return ""
        for d in (self.pipe_dir(gpu), self.log_dir(gpu)):
            d.mkdir(parents=True, exist_ok=True)
        path = shutil.which(self.binary)
        assert path is not None
        try:
            started = subprocess.run(
                [path, "-d"],
                env=self._env(gpu),
                capture_output=True,
                text=True,
                timeout=_START_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{self.binary} -d` failed: {exc}"
        if started.returncode != 0:
            out = (started.stderr or started.stdout).strip()[-300:]
            return f"`{self.binary} -d` exited {started.returncode}: {out}{self._log_tail(gpu)}"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.answers(gpu):
                self.started.append(gpu)
                return ""
            time.sleep(0.05)
        return (
            f"the daemon started but does not answer on {self.pipe_dir(gpu)}{self._log_tail(gpu)}"
        )

    def _log_tail(self, gpu: int) -> str:
        f = self.log_dir(gpu) / "control.log"
        try:
            tail = f.read_text(errors="replace").strip().splitlines()[-2:]
        except OSError:
            return ""
        return f" (control.log: {' | '.join(tail)})" if tail else ""

    def client_env(self, gpu: int, reserved_gib: float, capacity_gib: float) -> dict[str, str]:
        """The variables of an MPS client on GPU ``gpu``: its daemon, its device (by UUID, which
        names the same GPU with or without MPS), its memory limit and its compute share."""
        mib = math.ceil(reserved_gib * 1024 - 1e-9)
        share = shared_compute_share(reserved_gib, capacity_gib, self.max_jobs)
        return {
            "CUDA_VISIBLE_DEVICES": self.uuids.get(gpu, str(gpu)),
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(share)),
        }

    def stop(self) -> None:
        """Ask the daemons this worker started to quit (running clients finish first)."""
        for gpu in self.started:
            got = self._control(gpu, "quit")
            if got is None or got.returncode != 0:
                log.warning("MPS daemon of GPU %s did not take `quit`", gpu)
        self.started = []
