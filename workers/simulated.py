"""Simulated execution for machines without a GPU (tests, the demo). Labelled as such everywhere.

A simulated job's true peak VRAM and runtime are the analytical prediction for its GPU type times
an error factor drawn exactly as in the simulator (:class:`scheduler.sim.truth.ResidualModel`: the
empirical distribution of log(measured / analytical), or its documented lognormal placeholder
when no residual file exists). The draw is seeded by the job id alone: the job's truth does not
change between attempts, so an OOM retry with a larger reservation meets the same true peak (as
a real job would), and a rerun after a lost lease behaves the same.
The job "runs" by sleeping ``runtime x time_scale`` seconds; it dies
of OOM (after 10% of its runtime) when the true peak exceeds the memory it may use: the whole
GPU, its MIG slice, or its MPS limit (its reservation) on a shared GPU.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from typing import Any

import numpy as np

from workers.runner import RunResult

__all__ = ["OOM_AT_FRACTION", "SimulatedRun", "draw_truth"]

#: When an OOM'ing simulated job dies, as a fraction of its runtime (allocation peaks early).
OOM_AT_FRACTION = 0.1
_MAX_SLEEP_S = 3600.0

_residuals: Any = None


def _model() -> Any:
    global _residuals
    if _residuals is None:
        from scheduler.sim.truth import load_residuals

        _residuals = load_residuals()
    return _residuals


def draw_truth(
    job_id: str, predicted_peak_gib: float, predicted_runtime_s: float
) -> tuple[float, float]:
    """(true peak GiB, true runtime s) of a job, seeded by its id (the same for every attempt)."""
    seed = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "little")
    vram_f, runtime_f = _model().sample(1, np.random.default_rng(seed))
    return predicted_peak_gib * float(vram_f[0]), predicted_runtime_s * float(runtime_f[0])


class SimulatedRun:
    """A job that sleeps in scaled time; ``stop()`` ends it early (cancel / lost lease)."""

    simulated = True

    def __init__(
        self,
        job_id: str,
        attempt: int,
        *,
        predicted_peak_gib: float,
        predicted_runtime_s: float,
        limit_gib: float,
        time_scale: float,
        label: str,
        exact: bool = False,
    ) -> None:
        # ``exact``: the prediction is the truth. A serving replica pre-allocates its engine's
        # memory fraction and runs for its deployment's duration (inf: until stopped).
        self.true_peak_gib, self.true_runtime_s = (
            (predicted_peak_gib, predicted_runtime_s)
            if exact
            else draw_truth(job_id, predicted_peak_gib, predicted_runtime_s)
        )
        self.attempt = attempt
        self.limit_gib = limit_gib
        self.time_scale = time_scale
        self.oom = self.true_peak_gib > limit_gib
        run_s = self.true_runtime_s * (OOM_AT_FRACTION if self.oom else 1.0)
        self.sleep_s = (
            math.inf if math.isinf(run_s) else min(_MAX_SLEEP_S, max(0.0, run_s * time_scale))
        )
        self.run_s = run_s
        self.label = label
        self.job_id = job_id
        self._stop = threading.Event()
        self._t0 = 0.0
        self.stopped = False

    def start(self) -> None:
        self._t0 = time.monotonic()

    def wait(self, timeout_s: float) -> bool:
        """True once the run is over (finished or stopped)."""
        left = self._t0 + self.sleep_s - time.monotonic()
        if left <= 0 or self._stop.is_set():
            return True
        return self._stop.wait(min(timeout_s, left)) or time.monotonic() >= self._t0 + self.sleep_s

    def stop(self, grace_s: float = 0.0) -> None:
        self.stopped = True
        self._stop.set()

    def output_tail(self) -> None:
        return None  # the output is written once, at the end

    def result(self, limit_gib: float | None = None) -> RunResult:
        """The outcome; the limit was fixed at construction (``limit_gib`` is ignored)."""
        lines = [
            f"[simulated] job {self.job_id} on {self.label}: true peak "
            f"{self.true_peak_gib:.2f} GiB (limit {self.limit_gib:.2f} GiB), true runtime "
            f"{self.true_runtime_s:.1f} s, slept {self.sleep_s:.3f} s (scaled)",
        ]
        if self.stopped:
            lines.append("[simulated] stopped (SIGTERM)")
            ran_s = self.run_s
            if math.isinf(ran_s):  # until stopped: it ran as long as it slept (scaled back)
                ran_s = (time.monotonic() - self._t0) / max(self.time_scale, 1e-12)
            return RunResult(-15, None, self.true_peak_gib, ran_s, False, "\n".join(lines))
        if self.oom:
            lines.append(
                "torch.OutOfMemoryError: CUDA out of memory. [simulated] Tried to allocate "
                f"{self.true_peak_gib - self.limit_gib:.2f} GiB more than the "
                f"{self.limit_gib:.2f} GiB available"
            )
            return RunResult(1, None, self.limit_gib, self.run_s, True, "\n".join(lines))
        lines.append("[simulated] done")
        return RunResult(0, None, self.true_peak_gib, self.true_runtime_s, False, "\n".join(lines))
