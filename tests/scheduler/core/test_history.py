"""RequestHistory: ratios to the predictor's figures, carried across GPU types, OOM floors."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.gpus import GPU_NAMES
from predictor.history import CENSORED_FLOOR_MARGIN, CROSS_TYPE_MARGIN
from scheduler.core.history import RequestHistory
from scheduler.core.requests import PlacementRequest

H100, A100 = GPU_NAMES.index("H100-80GB"), GPU_NAMES.index("A100-80GB")


def _req() -> PlacementRequest:
    v = np.array([20.0, 20.0, 21.0, 21.0, 22.0])
    return PlacementRequest(
        job_id="j", vram_gib=v, vram_upper_gib=v * 1.1 + 0.5,
        runtime_s=np.full(5, 100.0), runtime_upper_s=np.full(5, 150.0),
    )  # fmt: skip


def test_unknown_fingerprint_is_not_answered() -> None:
    assert RequestHistory().apply("nope", _req()) is None


def test_measured_type_exact_other_types_by_ratio_with_wider_bound() -> None:
    h = RequestHistory()
    h.record_run("fp", "H100-80GB", 1.2, 0.9)
    got = h.apply("fp", _req())
    assert got is not None
    new, n = got
    assert n == 1
    assert new.vram_gib[H100] == pytest.approx(21.0 * 1.2)
    # The A100 estimate is the H100 ratio times the predictor's A100 figure, bound wider.
    assert new.vram_gib[A100] == pytest.approx(20.0 * 1.2)
    m = new.vram_upper_gib / new.vram_gib
    assert m[A100] == pytest.approx(m[H100] + CROSS_TYPE_MARGIN)
    assert new.runtime_s[H100] == pytest.approx(90.0)
    h.record_run("fp", "A100-80GB", 1.2, 0.9)  # once measured there, the normal bound
    new2, n2 = h.apply("fp", _req())  # type: ignore[misc]
    assert n2 == 1
    assert new2.vram_upper_gib[A100] < new.vram_upper_gib[A100]


def test_oom_floor_is_above_the_limit_never_a_peak() -> None:
    h = RequestHistory()
    h.record_oom("fp", "H100-80GB", 40.0 / 21.0)  # died at a 40 GiB slice
    new, n = h.apply("fp", _req())  # type: ignore[misc]
    assert n == 0  # not "answered by history": no finished run
    assert new.vram_upper_gib[H100] == pytest.approx(40.0 * (1 + CENSORED_FLOOR_MARGIN))
    assert new.vram_gib[H100] == pytest.approx(40.0)
    h.record_run("fp", "H100-80GB", 50.0 / 21.0)  # a finished run on a bigger slot
    new2, n2 = h.apply("fp", _req())  # type: ignore[misc]
    assert n2 == 1 and new2.vram_upper_gib[H100] >= 50.0
