"""Simulated execution for machines without a GPU (tests, the demo). Labelled as such everywhere.

A simulated run takes its truth from :func:`scheduler.sim.truth.draw_truth`, the function the
simulator calls: the predictor's own figures (the job record's ``predictions``) times one error
per fingerprint of the spec plus a run-to-run noise per job id, keyed by the truth seed
(``--truth-seed``; the demo passes its workload seed). The truth does not change between
attempts, so an OOM retry meets the same true peak, as a real job would. The job "runs" by
sleeping ``runtime x time_scale`` seconds; when the true peak exceeds what it may allocate
(:func:`scheduler.core.rules.memory_limit_gib`) it dies at the simulator's OOM point
(:func:`scheduler.sim.truth.oom_fraction`) and reports only its limit, a lower bound.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from workers.runner import RunResult

__all__ = ["SimulatedRun", "true_factors"]

_MAX_SLEEP_S = 3600.0

_residuals: Any = None


def _model() -> Any:
    global _residuals
    if _residuals is None:
        from scheduler.sim.truth import load_residuals

        _residuals = load_residuals()
    return _residuals


def true_factors(seed: int, fingerprint: str, job_id: str) -> tuple[float, float]:
    """(VRAM factor, runtime factor) of this run over the predictor's figures, as simulated."""
    from scheduler.sim.truth import draw_truth

    vf, rf = draw_truth(_model(), seed, [fingerprint], [job_id])
    return float(vf[0]), float(rf[0])


class SimulatedRun:
    """A job that sleeps in scaled time; ``stop()`` ends it early (cancel / lost lease).

    ``predicted_peak_gib`` is the predictor's peak on the slot's GPU type and
    ``predicted_runtime_s`` its runtime on this slot (MIG/shared slow-down included, history
    not applied), the figures the simulator's truth scales too.
    """

    simulated = True

    def __init__(
        self,
        job_id: str,
        attempt: int,
        *,
        fingerprint: str,
        seed: int,
        predicted_peak_gib: float,
        predicted_runtime_s: float,
        limit_gib: float,
        time_scale: float,
        label: str,
        exact: bool = False,
    ) -> None:
        from scheduler.sim.truth import oom_fraction

        # ``exact``: the prediction is the truth. A serving replica pre-allocates its engine's
        # memory fraction and runs for its deployment's duration (inf: until stopped).
        vf, rf = (1.0, 1.0) if exact else true_factors(seed, fingerprint, job_id)
        self.exact = exact
        self.true_peak_gib = predicted_peak_gib * vf
        self.true_runtime_s = predicted_runtime_s * rf
        self.attempt = attempt
        self.limit_gib = limit_gib
        self.oom = self.true_peak_gib > limit_gib + 1e-9
        at = oom_fraction(seed, job_id, attempt) if self.oom else 1.0
        run_s = self.true_runtime_s * at
        self.sleep_s = (
            math.inf if math.isinf(run_s) else min(_MAX_SLEEP_S, max(0.0, run_s * time_scale))
        )
        self.run_s = run_s
        self.time_scale = time_scale
        self.label = label
        self.job_id = job_id
        self._stop = threading.Event()
        self._t0 = 0.0
        self._stopped_at: float | None = None
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
        if not self.stopped:
            self._stopped_at = time.monotonic()
        self.stopped = True
        self._stop.set()

    def output_tail(self) -> None:
        return None  # the output is written once, at the end

    def _ran_s(self) -> float:
        """Simulated seconds the run lasted: all of it, or until it was stopped (a run with no
        end, a serving replica, lasts as long as it slept, scaled back)."""
        if self._stopped_at is None or self.time_scale <= 0:
            return self.run_s
        return min(self.run_s, max(0.0, self._stopped_at - self._t0) / self.time_scale)

    def result(self, limit_gib: float | None = None) -> RunResult:
        """The outcome; the limit was fixed at construction (``limit_gib`` is ignored)."""
        lines = [
            f"[simulated] job {self.job_id} on {self.label}: true peak "
            f"{self.true_peak_gib:.2f} GiB (limit {self.limit_gib:.2f} GiB), true runtime "
            f"{self.true_runtime_s:.1f} s, slept {self.sleep_s:.3f} s (scaled)",
        ]
        if self.stopped:
            lines.append("[simulated] stopped (SIGTERM)")
            # A stopped replica held its engine's fraction the whole time; a stopped job's
            # peak is unknown.
            peak = self.true_peak_gib if self.exact else None
            return RunResult(-15, None, peak, self._ran_s(), False, "\n".join(lines))
        if self.oom:
            lines.append(
                "torch.OutOfMemoryError: CUDA out of memory. [simulated] Tried to allocate "
                f"{self.true_peak_gib - self.limit_gib:.2f} GiB more than the "
                f"{self.limit_gib:.2f} GiB available"
            )
            return RunResult(1, None, self.limit_gib, self.run_s, True, "\n".join(lines))
        lines.append("[simulated] done")
        return RunResult(0, None, self.true_peak_gib, self.true_runtime_s, False, "\n".join(lines))
