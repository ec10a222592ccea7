import numpy as np
import pytest

from predictor.exceptions import NotFittedError
from predictor.learned import (
    MAX_LOG_CORRECTION,
    LearnedPredictor,
    ResidualRegressor,
    cross_validate,
)
from predictor.measurements import load_measurements
from predictor.spec import parse_spec


@pytest.fixture(scope="module")
def measurements():
    return load_measurements()


@pytest.fixture(scope="module")
def fitted(measurements):
    return LearnedPredictor().fit(measurements, version_date="2026-01-01")


def test_regressor_is_sklearn_style_and_bounded():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 27))
    y = 5.0 * X[:, 0]
    est = ResidualRegressor()
    with pytest.raises(NotFittedError):
        est.predict(X)
    assert est.fit(X, y) is est
    out = est.predict(X)
    assert np.all(np.abs(out) <= MAX_LOG_CORRECTION + 1e-12)
    assert np.corrcoef(out, y)[0, 1] > 0.8


def test_fit_reports_cv_and_falls_back_when_not_better(fitted):
    # Which name depends on the data: "learned" only while some correction beats analytical.
    kind = "learned" if fitted.enabled_metrics else "analytical+conformal"
    assert fitted.method.startswith(f"{kind}:2026-01-01-")
    for metric, cv in fitted.cv_.items():
        better = cv["learned_mape"] < cv["analytical_mape"]
        assert (fitted.models_[metric] is not None) == better
        assert better or metric in fitted.fallback_


def test_predict_table_keeps_contract_and_bounds(fitted):
    specs = [
        parse_spec({"model": "llama-3.1-8b", "task": "inference", "batch_size": 8}),
        parse_spec({"model": "qwen2.5-7b", "task": "lora", "seq_len": 1024}),
    ]
    t = fitted.predict_table(specs)
    assert t.peak_vram_gib.shape == (2, 5)
    assert np.all(t.peak_vram_upper_gib >= t.peak_vram_gib)
    assert np.all(t.runtime_upper_s >= t.runtime_s)
    total = sum(t.breakdown_gib.values())
    np.testing.assert_allclose(total, t.peak_vram_gib, rtol=1e-6)
    assert t.method[0] == fitted.method


def test_reservation_coverage_widens_bounds(fitted):
    spec = [parse_spec({"model": "llama-3.1-8b", "task": "full_finetune"})]
    t95 = fitted.predict_table(spec)
    t99 = fitted.with_coverage(0.99).predict_table(spec)
    assert np.all(t99.peak_vram_upper_gib >= t95.peak_vram_upper_gib - 1e-3)


def test_grouped_cv_covers_and_never_beats_fallback_rule(measurements):
    res = cross_validate(measurements, n_splits=3)
    for metric, cmp in res.comparison.items():
        learned = res.report.overall[metric].mape
        assert learned <= max(cmp["analytical_mape"], cmp["learned_mape"]) + 1e-9
        assert learned <= cmp["analytical_mape"] + 1e-9
    assert res.report.overall["peak_vram_gib"].coverage >= 0.85


def test_method_says_only_bounds_when_no_correction_applies(fitted):
    specs = [
        parse_spec({"model": "llama-3.1-8b", "task": "inference", "batch_size": 8}),
        parse_spec({"model": "qwen2.5-7b", "task": "lora", "seq_len": 1024}),
    ]
    ver = fitted.version_
    off = fitted.with_coverage(0.95)
    off.models_ = {m: None for m in off.models_}
    assert off.method == f"analytical+conformal:{ver}"
    assert set(off.predict_table(specs).method) == {f"analytical+conformal:{ver}"}
    if fitted.enabled_metrics:
        assert fitted.method == f"learned:{ver}"


def test_reservation_coverage_also_widens_runtime_bounds(fitted):
    spec = [parse_spec({"model": "llama-3.1-8b", "task": "full_finetune"})]
    t = fitted.predict_table(spec)
    t99 = fitted.with_coverage(0.99).predict_table(spec)
    assert np.all(t99.runtime_upper_s >= t.runtime_upper_s - 1e-9)
    assert fitted.coverage == 0.95 and fitted.runtime_coverage == 0.90
