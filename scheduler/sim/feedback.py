"""Feedback from measured runs: a recurring job's next prediction from what it really used.

This is the history tier as the simulator runs it (the live predictor's counterpart is
:mod:`predictor.history`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.core.requests import PlacementRequest

__all__ = ["FeedbackHistory"]


def _percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile, without numpy's per-call overhead on short lists:
    it runs once per submission of a recurring job."""
    xs = sorted(values)
    pos = q / 100.0 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class FeedbackHistory:
    """What the cluster measured per fingerprint, turned into the next run's prediction.

    Values are ratios to the analytical point prediction (measured peak / predicted peak,
    measured runtime / predicted runtime). In the simulator's truth a job's error is the same on
    every GPU type, so a ratio measured on one type predicts all of them, and the runtime ratio
    carries over when a re-run has a different length. Over the last ``window`` runs, the point is
    the ``percentile`` of the ratios and the VRAM upper bound the largest one times
    ``1 + margin + margin_per_run / n`` (a wider margin while few runs are known), as Autopilot's
    recommender does with a high percentile of recent peaks plus a safety margin.
    """

    window: int = 20
    percentile: float = 95.0
    margin: float = 0.05
    margin_per_run: float = 0.10
    runtime_margin: float = 0.10
    _vram: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list), repr=False)
    _runtime: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list), repr=False)

    def record(self, fingerprint: str, vram_ratio: float, runtime_ratio: float | None) -> None:
        self._vram[fingerprint].append(float(vram_ratio))
        if runtime_ratio is not None:
            self._runtime[fingerprint].append(float(runtime_ratio))

    def n_runs(self, fingerprint: str) -> int:
        return len(self._vram.get(fingerprint, ()))

    def vram(self, fingerprint: str) -> tuple[float, float] | None:
        """(point ratio, upper ratio), or None before the first measurement."""
        runs = self._vram.get(fingerprint)
        if not runs:
            return None
        recent = runs[-self.window :]
        point = _percentile(recent, self.percentile)
        upper = max(recent) * (1.0 + self.margin + self.margin_per_run / len(recent))
        return point, upper

    def runtime(self, fingerprint: str) -> tuple[float, float] | None:
        runs = self._runtime.get(fingerprint)
        if not runs:
            return None
        recent = runs[-self.window :]
        return _percentile(recent, 50.0), max(recent) * (1.0 + self.runtime_margin)

    def apply(self, fingerprint: str, request: PlacementRequest) -> PlacementRequest | None:
        """``request`` predicted from this fingerprint's history; None if there is none."""
        v = self.vram(fingerprint)
        if v is None:
            return None
        r = self.runtime(fingerprint)
        return replace(
            request,
            vram_gib=request.vram_gib * v[0],
            vram_upper_gib=request.vram_gib * v[1],
            runtime_s=request.runtime_s if r is None else request.runtime_s * r[0],
            runtime_upper_s=request.runtime_upper_s if r is None else request.runtime_s * r[1],
        )
