"""A recurring job's request from what its earlier runs really used (the history tier, placed).

:class:`RequestHistory` wraps :class:`predictor.history.HistoryPredictor`'s ratio form and turns
its factors into a :class:`~scheduler.core.requests.PlacementRequest`. The live leader and the
simulator both use it, fed the same way: a finished run adds measured / predicted ratios, an OOM
adds a censored floor (the limit it died at). Ratios are always to the predictor's own figures
(the request as submitted), never to a history-adjusted one, so history does not compound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from predictor.gpus import GPU_NAMES
from predictor.history import CENSORED_FLOOR_MARGIN, HistoryFactors, HistoryPredictor
from scheduler.core.requests import PlacementRequest

__all__ = ["RequestHistory", "history_method"]


def history_method(n_runs: int) -> str:
    """The ``method`` of a request answered by history (the Prediction contract's form)."""
    return f"history:{n_runs} runs"


@dataclass
class RequestHistory:
    """Per fingerprint, what was measured, and the next request it implies."""

    predictor: HistoryPredictor = field(default_factory=HistoryPredictor)
    rows: int = 0  # observations fed so far
    # Per fingerprint, the last answer's figures with the factors and base figures they came
    # from: a recurring job's submissions share both until its next observation.
    _answers: dict[str, tuple[object, bytes, tuple[np.ndarray, ...]]] = field(
        default_factory=dict, repr=False
    )

    def record_run(
        self, fp: str, gpu: str, vram_ratio: float | None, runtime_ratio: float | None = None
    ) -> None:
        """A finished attempt on ``gpu``: its measured peak and runtime as ratios to the
        predictor's figures there (None: not measured)."""
        self.predictor.observe(fp, gpu, vram_ratio, runtime_ratio)
        self.rows += 1

    def record_oom(self, fp: str, gpu: str, limit_ratio: float | None) -> None:
        """An attempt OOM-killed on ``gpu``: the limit it died at over the predicted peak, a
        floor under its real peak (never a peak itself)."""
        self.predictor.observe(fp, gpu, limit_ratio, censored=True)
        self.rows += 1

    def n_runs(self, fp: str) -> int:
        f = self.predictor.factors(fp, GPU_NAMES)
        return 0 if f is None else f.n_runs

    def apply(self, fp: str, base: PlacementRequest) -> tuple[PlacementRequest, int] | None:
        """``base`` re-predicted from ``fp``'s history and the number of finished runs behind it
        (0: only an OOM floor applied); None when nothing is known."""
        f = self.predictor.factors(fp, GPU_NAMES)
        if f is None:
            return None
        key = b"".join(
            a.tobytes()
            for a in (base.vram_gib, base.vram_upper_gib, base.runtime_s, base.runtime_upper_s)
        )
        got = self._answers.get(fp)
        if got is None or got[0] is not f or got[1] != key:
            figures = self._figures(f, base)
            for a in figures:
                a.flags.writeable = False  # shared by every request of this answer
            got = (f, key, figures)
            self._answers[fp] = got
        return base.with_figures(*got[2]), f.n_runs

    @staticmethod
    def _figures(f: HistoryFactors, base: PlacementRequest) -> tuple[np.ndarray, ...]:
        """(VRAM, upper VRAM, runtime, upper runtime) per type: ``base`` times ``f``."""
        vram, upper = base.vram_gib.copy(), base.vram_upper_gib.copy()
        runtime, runtime_up = base.runtime_s.copy(), base.runtime_upper_s.copy()
        known = np.isfinite(f.vram_point)
        vram[known] = base.vram_gib[known] * f.vram_point[known]
        upper[known] = base.vram_gib[known] * f.vram_upper[known]
        if math.isfinite(float(f.vram_floor[0])):
            floor = base.vram_gib * f.vram_floor
            vram = np.maximum(vram, floor / (1.0 + CENSORED_FLOOR_MARGIN))  # the limit itself
            upper = np.maximum(upper, floor)
        rt = np.isfinite(f.runtime_point)
        runtime[rt] = base.runtime_s[rt] * f.runtime_point[rt]
        runtime_up[rt] = base.runtime_s[rt] * f.runtime_upper[rt]
        return vram, upper, runtime, runtime_up
