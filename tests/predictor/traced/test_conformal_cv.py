"""The traced tier's conformal bound is calibrated within grouped CV by source."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.evaluation import PredictedValues
from predictor.measurements import METRICS, measurement_row, parse_measurement
from predictor.traced.evaluation import conformal_by_source

SPEC = {"model": "llama-3.1-8b", "task": "lora", "seq_len": 512}


def _rows(source: str, n: int, measured: float, confidence: str = "medium") -> list:
    return [
        parse_measurement(
            measurement_row(
                id=f"{source}-{i}",
                origin="profile",
                source=source,
                spec=SPEC,
                gpu="H100-80GB",
                measurement="allocated",
                peak_vram_gib=measured,
                confidence=confidence,
            )
        )
        for i in range(n)
    ]


def _predicted_10_gib(n: int) -> PredictedValues:
    """A 10 GiB peak-VRAM point for each of ``n`` rows on one H100, nothing else predicted."""
    point = {m: np.full(n, np.nan) for m in METRICS}
    point["peak_vram_gib"] = np.full(n, 10.0)
    upper = {m: np.full(n, np.nan) for m in METRICS}
    return PredictedValues(point, upper, ("H100-80GB",) * n)


def test_each_source_is_bounded_by_the_other_sources_residuals_only() -> None:
    ms = _rows("a", 40, 12.0) + _rows("b", 40, 15.0)
    n = len(ms)
    pv = _predicted_10_gib(n)
    out = conformal_by_source(ms, pv, [True] * n).upper["peak_vram_gib"]
    # source a (under-predicted by 1.2x) gets b's 1.5x margin and vice versa
    assert out[:40] == pytest.approx(np.full(40, 15.0))
    assert out[40:] == pytest.approx(np.full(40, 12.0))


def test_source_weighting_counts_each_other_source_once() -> None:
    """Forty rows of source a fit well, one row of b and one of c are 1.5x and 1.3x under:
    row-weighted, a held-out b sees 41 rows, a's set the 95% quantile and no margin;
    source-weighted it sees two sources, so c's margin (the largest of too few) sets b's."""
    ms = _rows("a", 40, 10.0) + _rows("b", 1, 15.0) + _rows("c", 1, 13.0)
    n = len(ms)
    pv = _predicted_10_gib(n)
    rows = conformal_by_source(ms, pv, [True] * n).upper["peak_vram_gib"]
    by_source = conformal_by_source(ms, pv, [True] * n, weighting="source")
    assert rows[40] == pytest.approx(10.0)  # rank ceil(42 x 0.95) = 40 of 41: a's
    assert by_source.upper["peak_vram_gib"][40] == pytest.approx(13.0)


def test_low_confidence_rows_calibrate_only_when_asked() -> None:
    """Source c's one row is low-confidence and 1.4x under: it never sets a bound by default,
    and with ``low_confidence`` it sets the held-out a's (b's 1.2x is the only other)."""
    ms = _rows("a", 3, 10.0) + _rows("b", 3, 12.0) + _rows("c", 1, 14.0, confidence="low")
    n = len(ms)
    pv = _predicted_10_gib(n)
    default = conformal_by_source(ms, pv, [True] * n, weighting="source")
    wider = conformal_by_source(ms, pv, [True] * n, weighting="source", low_confidence=True)
    assert default.upper["peak_vram_gib"][0] == pytest.approx(12.0)
    assert wider.upper["peak_vram_gib"][0] == pytest.approx(14.0)
    # the low-confidence row is still scored: its own bound comes from a and b
    assert wider.upper["peak_vram_gib"][6] == pytest.approx(12.0)
