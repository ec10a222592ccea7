import numpy as np

from predictor.history import HistoryPredictor
from predictor.measurements import parse_measurement
from predictor.spec import parse_spec
from predictor.tiered import TieredPredictor, rescale_breakdown

SPEC = {"model": "llama-3.1-8b", "task": "lora", "seq_len": 1024, "batch_size": 2}


def _run(i: int, peak: float) -> object:
    return parse_measurement(
        {
            "id": f"h{i}",
            "origin": "history",
            "source": "node a",
            "spec": SPEC,
            "gpu": "H100-80GB",
            "peak_vram_gib": peak,
            "measurement": "nvml_used",
        }
    )


def test_history_peak_keeps_a_breakdown_that_sums_to_it():
    hist = HistoryPredictor().fit([_run(1, 30.0), _run(2, 31.0)])
    tp = TieredPredictor(history=hist)
    t = tp.predict_table([parse_spec(SPEC)], ["H100-80GB", "A100-80GB"])
    assert t.method[0] == "history:2 runs"
    total = sum(t.breakdown_gib.values())
    np.testing.assert_allclose(total, t.peak_vram_gib, rtol=1e-9)
    assert t.peak_vram_gib[0, 0] > 30.0
    assert t.breakdown_gib["overhead"][0, 0] > 0


def test_rescale_breakdown_when_the_peak_is_below_overhead():
    b = {"weights": np.array([10.0]), "overhead": np.array([2.0])}
    out = rescale_breakdown(b, np.array([12.0]), np.array([1.5]))
    assert out["overhead"][0] == 1.5 and out["weights"][0] == 0.0


def test_analytical_only_says_analytical():
    t = TieredPredictor().predict_table([parse_spec(SPEC)], ["H100-80GB"])
    assert t.method == ("analytical",)
