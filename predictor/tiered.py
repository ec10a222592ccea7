"""Analytical → traced → learned → history, behind the same interface as ``predictor.analytical``.

Each job on each GPU type gets the most specific answer available: its own history when it
has recurred there, else the learned correction (when an artifact is present) of the best base
(the traced peak where the trace cache holds one, else the analytical figure). ``method`` names
the tier per job: ``analytical``, ``traced``, ``analytical+conformal:<version>`` /
``traced+conformal:<version>`` (only the upper bounds come from the artifact),
``learned:<version>`` / ``traced+learned:<version>`` (a learned correction changed the point)
or ``history:<n> runs`` (a job answered by history on some GPU types). Prediction never waits
for a trace: jobs not in the cache get the analytical base (``snugfit trace`` warms it). When
history replaces a peak, the tensor components of ``breakdown_gib`` are rescaled so they still
sum to it, as the contract requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .analytical import AnalyticalPredictor
from .conformal import DEFAULT_COVERAGE
from .exceptions import ArtifactError
from .gpus import get_gpu
from .history import HistoryPredictor
from .learned import LearnedPredictor
from .measurements import Measurement
from .prediction import Prediction, PredictionTable, contract_rows
from .spec import JobSpec
from .traced import TracedPredictor

__all__ = ["TieredPredictor", "default_predictor", "rescale_breakdown"]


def rescale_breakdown(
    breakdown: dict[str, np.ndarray], old_peak: np.ndarray, new_peak: np.ndarray
) -> dict[str, np.ndarray]:
    """Scale the tensor components so the breakdown sums to ``new_peak``.

    ``overhead`` (memory no tensor holds) keeps its value unless the new peak is below it; then
    it is the whole peak and every tensor component is zero.
    """
    ovh = np.minimum(breakdown["overhead"], new_peak)
    old_t = old_peak - breakdown["overhead"]
    factor = np.where(old_t > 0, (new_peak - ovh) / np.where(old_t > 0, old_t, 1.0), 0.0)
    out = {k: (v * factor if k != "overhead" else ovh) for k, v in breakdown.items()}
    if not np.allclose(sum(out.values()), new_peak, rtol=1e-9, atol=1e-9):
        # No tensor component to scale (all zero): overhead absorbs the difference.
        out["overhead"] = new_peak - sum(v for k, v in out.items() if k != "overhead")
    return out


class TieredPredictor:
    def __init__(
        self,
        learned: LearnedPredictor | None = None,
        history: HistoryPredictor | None = None,
        analytical: AnalyticalPredictor | None = None,
        traced: TracedPredictor | None = None,
    ) -> None:
        self.analytical = analytical or AnalyticalPredictor()
        self.traced = traced
        self.learned = learned
        self.history = history
        if learned is not None and traced is not None:
            learned.base = traced
        # (coverage, path, (mtime_ns, size)) of the active artifact this follows, if any.
        self._follow: tuple[float, Path, tuple[int, int] | None] | None = None

    @classmethod
    def default(
        cls,
        artifact: str | Path | None = None,
        history: Sequence[Measurement] | None = None,
        coverage: float = DEFAULT_COVERAGE,
        traced: TracedPredictor | None = None,
    ) -> TieredPredictor:
        """The shipped artifact when present (else analytical only) on the traced base
        (cached traces only unless ``traced`` says otherwise), plus optional history."""
        from .artifact import active_artifact_path, load_artifact

        path = Path(artifact) if artifact is not None else active_artifact_path()
        stamp = _stamp(path)
        try:
            learned: LearnedPredictor | None = load_artifact(path, coverage=coverage)
        except ArtifactError:
            if artifact is not None:
                raise
            learned = None
        hist = HistoryPredictor().fit(history) if history else None
        out = cls(learned=learned, history=hist, traced=traced or TracedPredictor())
        if artifact is None:
            out._follow = (coverage, path, stamp)
        return out

    def refresh(self) -> bool:
        """Reload the learned tier if the active artifact changed since it was loaded (a
        retrain under ``$SNUGFIT_HOME`` replaced it); True when it did. Only a predictor built
        by :meth:`default` without an explicit artifact follows the active one. A file that
        cannot be read keeps the tier as it was (the retrainer replaces files atomically)."""
        if self._follow is None:
            return False
        from .artifact import active_artifact_path, load_artifact

        coverage, path, stamp = self._follow
        now_path = active_artifact_path()
        now_stamp = _stamp(now_path)
        if now_path == path and now_stamp == stamp:
            return False
        try:
            learned = load_artifact(now_path, coverage=coverage)
        except ArtifactError:
            return False
        if self.traced is not None:
            learned.base = self.traced
        self.learned = learned
        self._follow = (coverage, now_path, now_stamp)
        return True

    def predict_table(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> PredictionTable:
        base = self.learned or self.traced or self.analytical
        t = base.predict_table(specs, gpus)
        if self.history is None or len(specs) == 0:
            return t
        peak, upper = t.peak_vram_gib.copy(), t.peak_vram_upper_gib.copy()
        step, ttft, tpot = t.step_time_s.copy(), t.ttft_s.copy(), t.tpot_s.copy()
        runtime, runtime_up = t.runtime_s.copy(), t.runtime_upper_s.copy()
        methods = list(t.method)
        for i, spec in enumerate(specs):
            used = 0
            for j, gpu in enumerate(t.gpu_names):
                got = self.history.lookup(spec, gpu, "peak_vram_gib")
                if got is not None:
                    peak[i, j], upper[i, j], n = got
                    used = max(used, n)
                for arr, metric in ((step, "step_time_s"), (ttft, "ttft_s"), (tpot, "tpot_s")):
                    g = self.history.lookup(spec, gpu, metric)
                    if g is not None:
                        ratio = g[0] / arr[i, j] if np.isfinite(arr[i, j]) and arr[i, j] else 1.0
                        arr[i, j] = g[0]
                        if metric == "step_time_s":
                            runtime[i, j] *= ratio
                            runtime_up[i, j] = max(runtime_up[i, j], runtime[i, j])
                        used = max(used, g[2])
            if used:
                methods[i] = f"history:{used} runs"
        cap = np.array([get_gpu(g).memory_gib for g in t.gpu_names])[None, :]
        return replace(
            t,
            breakdown_gib=rescale_breakdown(dict(t.breakdown_gib), t.peak_vram_gib, peak),
            peak_vram_gib=peak,
            peak_vram_upper_gib=upper,
            step_time_s=step,
            ttft_s=ttft,
            tpot_s=tpot,
            runtime_s=runtime,
            runtime_upper_s=runtime_up,
            fits=upper <= cap,
            method=tuple(methods),
        )

    def predict(
        self, specs: Sequence[JobSpec], gpus: Sequence[str] | None = None
    ) -> list[Prediction]:
        return [
            Prediction.model_construct(**r) for r in contract_rows(self.predict_table, specs, gpus)
        ]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def default_predictor() -> TieredPredictor:
    """The predictor the CLI and the service use: the active artifact (``$SNUGFIT_HOME``'s
    trained one, else the shipped one: calibrated bounds and learned corrections where they
    beat analytical), falling back to the analytical tier. :meth:`TieredPredictor.refresh`
    picks up a retrained artifact."""
    return TieredPredictor.default()
