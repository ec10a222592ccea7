import numpy as np
import pytest

from predictor.evaluation import PredictedValues, evaluate, predicted_values, summarise
from predictor.gpus import GPU_NAMES
from predictor.measurements import METRICS, measurement_row, parse_measurement
from predictor.prediction import BREAKDOWN_KEYS, PredictionTable

SPEC = {"model": "llama-3.1-8b", "task": "inference", "input_len": 128, "output_len": 16}


def _m(id, kind, gpu="H100-80GB", **kw):
    return parse_measurement(
        measurement_row(
            id=id, origin="profile", source=f"src-{id}", spec=SPEC, gpu=gpu, measurement=kind, **kw
        )
    )


def _table(n, peak=20.0, overhead=2.0, tpot=0.01):
    g = len(GPU_NAMES)
    full = lambda v: np.full((n, g), v)  # noqa: E731
    bd = {k: full(0.0) for k in BREAKDOWN_KEYS}
    bd["weights"] = full(peak - overhead)
    bd["overhead"] = full(overhead)
    tp = np.tile(np.linspace(1, 2, g) * tpot, (n, 1))
    return PredictionTable(
        job_ids=(None,) * n,
        gpu_names=GPU_NAMES,
        peak_vram_gib=full(peak),
        peak_vram_upper_gib=full(peak * 1.1),
        runtime_s=tp * 10,
        runtime_upper_s=tp * 15,
        breakdown_gib=bd,
        step_time_s=full(np.nan),
        ttft_s=full(0.1),
        tpot_s=tp,
        fits=full(True),
        method=("test",) * n,
    )


def test_vram_is_compared_like_with_like():
    ms = [
        _m("a", "allocated", peak_vram_gib=18.0),
        _m("n", "nvml_used", peak_vram_gib=20.0),
        _m("r", "reserved", peak_vram_gib=19.45, gpu="H100-80GB"),
    ]
    pv = predicted_values(ms, lambda specs, gpus: _table(len(specs)))
    p = pv.point["peak_vram_gib"]
    assert p[0] == pytest.approx(18.0)  # peak − overhead
    assert p[1] == pytest.approx(20.0)  # full peak
    assert 18.0 < p[2] < 20.0  # peak − CUDA context only
    rep = evaluate(ms, pv)
    assert rep.overall["peak_vram_gib"].n == 3


def test_summary_statistics():
    s = summarise(np.array([10.0, 10.0]), np.array([11.0, 8.0]), np.array([12.0, 9.0]))
    assert s.mape == pytest.approx(0.15)
    assert s.within_10pct == 0.5
    assert s.coverage == 0.5
    assert s.mean_headroom == pytest.approx((12 / 11 - 1 + 9 / 8 - 1) / 2)


def test_cross_gpu_ratio_and_unexpressed_rows():
    ms = [
        _m("a", "unknown", gpu="A100-80GB", tpot_s=0.02),
        _m("h", "unknown", gpu="H100-80GB", tpot_s=0.01),
        _m("x", "unknown", gpu=None, gpu_model="L40S", tpot_s=0.03),
    ]
    rep = evaluate(ms, lambda specs, gpus: _table(len(specs)))
    assert len(rep.ratios) == 1
    r = rep.ratios[0]
    assert (r.gpu_a, r.gpu_b, r.measured_ratio) == ("A100-80GB", "H100-80GB", 2.0)
    assert any(u.id == "x" and u.metric == "tpot_s" for u in rep.unexpressed)
    assert set(rep.to_dict()) >= {"overall", "by_task", "by_gpu", "by_source", "unexpressed"}


def test_precomputed_values_are_scored_as_given():
    ms = [_m("a", "allocated", peak_vram_gib=10.0)]
    point = {k: np.array([np.nan]) for k in METRICS}
    point["peak_vram_gib"] = np.array([12.0])
    rep = evaluate(ms, PredictedValues(point, point, ("H100-80GB",)), tier="x")
    assert rep.overall["peak_vram_gib"].mape == pytest.approx(0.2)


def test_stated_context_and_nccl_change_what_a_reading_is_compared_with():
    from predictor._memory import MemoryModel

    mm = MemoryModel()
    multi = {**SPEC, "n_gpus": 2, "tensor_parallel": 2}
    ms = [
        _m("n", "nvml_used", peak_vram_gib=20.0, hardware={"cuda_context_gib": 1.3}),
        parse_measurement(
            measurement_row(
                id="r2",
                origin="profile",
                source="s",
                spec=multi,
                gpu="H100-80GB",
                measurement="reserved",
                peak_vram_gib=19.0,
            )
        ),
    ]
    pv = predicted_values(ms, lambda specs, gpus: _table(len(specs)))
    p = pv.point["peak_vram_gib"]
    # the source's own 1.3 GiB context replaces the catalogue GPU's
    assert p[0] == pytest.approx(20.0 - mm.context_gib("H100-80GB") + 1.3)
    # reserved holds neither the context nor NCCL's cudaMalloc'd buffers
    assert p[1] == pytest.approx(20.0 - mm.context_gib("H100-80GB") - mm.nccl_buffers_gib)
