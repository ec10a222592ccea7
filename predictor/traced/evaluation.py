"""Accuracy of the traced tier on measured peak-VRAM rows: over all, and over those it covers.

The traced tier has nothing fitted, so it is scored directly (no cross-validation is needed:
no measured value ever reaches it). Rows it does not cover (excluded frameworks, families it
cannot build, failed traces) get the analytical answer in the all-rows report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..evaluation import EvalReport, evaluate, predicted_values
from ..measurements import Measurement
from ._api import TracedPredictor, trace_specs
from .cache import TraceCache

__all__ = ["traced_reports", "warm_measured"]


def warm_measured(
    measurements: Sequence[Measurement],
    *,
    workers: int = 1,
    cache: TraceCache | None = None,
    analytical: Any = None,
) -> TracedPredictor:
    """Trace the jobs of the rows that measured peak VRAM (what a trace can change) and return
    a cache-reading :class:`TracedPredictor` for them: the base of the learned tier.

    ``analytical`` answers what the traces do not (runtimes, untraceable jobs); pass the
    out-of-source analytical predictor when cross-validating, so its time figures stay out of
    source.
    """
    cache = cache or TraceCache()
    vram = [m.spec for m in measurements if m.peak_vram_gib is not None]
    trace_specs(vram, workers=workers, cache=cache)
    return TracedPredictor(cache=cache, analytical=analytical)


def traced_reports(
    measurements: Sequence[Measurement],
    *,
    workers: int = 1,
    cache: TraceCache | None = None,
) -> list[EvalReport]:
    """``[traced (all rows), traced (covered rows)]``; traces what the cache lacks first."""
    cache = cache or TraceCache()
    measurements = [m for m in measurements if m.peak_vram_gib is not None]
    outs = trace_specs([m.spec for m in measurements], workers=workers, cache=cache)
    pred = TracedPredictor(cache=cache)
    pv = predicted_values(measurements, pred)
    everything = evaluate(measurements, pv, tier="traced")
    covered_ids = {m.id for m, o in zip(measurements, outs, strict=True) if o.traced}
    covered = [m for m in measurements if m.id in covered_ids]
    sub = evaluate(covered, pred, tier="traced (covered rows)")
    from collections import Counter

    why = Counter(o.status for o in outs if not o.traced)
    note = (
        f"traced tier covers {len(covered)} of {len(measurements)} measured jobs; the rest "
        f"answered analytically ({', '.join(f'{k}: {v}' for k, v in sorted(why.items()))})"
    )
    everything.notes.append(note)
    sub.notes.append(note)
    return [everything, sub]
