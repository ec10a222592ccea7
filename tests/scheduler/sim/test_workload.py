from __future__ import annotations

import numpy as np
import pytest

from predictor.gpus import GPU_NAMES
from scheduler.exceptions import SimulationError
from scheduler.sim.workload import generate_workload, load_mix


def test_same_seed_same_workload() -> None:
    a = generate_workload(0.5, seed=3)
    b = generate_workload(0.5, seed=3)
    assert [s.to_dict() for s in a.specs] == [s.to_dict() for s in b.specs]
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert a.requested_gpu == b.requested_gpu


def test_mix_shape_and_diurnal_arrivals() -> None:
    w = generate_workload(7, seed=0)
    mix = load_mix()
    assert len(w) == pytest.approx(7 * mix.jobs_per_day, rel=0.15)
    assert np.all(np.diff(w.arrival_s) >= 0)
    hours = (w.arrival_s / 3600) % 24
    near_peak = np.abs(hours - mix.peak_hour) < 3
    night = np.abs(((hours - mix.peak_hour) % 24) - 12) < 3
    assert near_peak.sum() > 1.5 * night.sum()
    assert set(w.requested_gpu) <= set(GPU_NAMES)
    models = [s.arch.name for s in w.specs]
    small = sum(1 for s in w.specs if 6 <= (s.arch.params_b or 0) <= 9.5)
    assert small / len(models) > 0.4  # skewed to 7-8B
    assert {s.task.value for s in w.specs} >= {"inference", "lora", "qlora", "full_finetune"}


def test_bad_days_rejected() -> None:
    with pytest.raises(SimulationError, match="positive"):
        generate_workload(0, seed=0)


def test_the_drawers_pick_is_numpys_choice_draw_for_draw() -> None:
    import numpy as np

    from scheduler.sim.workload import _Drawer, load_mix

    mix = load_mix()
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    d = _Drawer(mix, a)
    weights = (d.class_w, d.model_w, d.gpu_w)
    for k in range(3000):
        which = k % 3
        assert d._pick(which) == int(b.choice(len(weights[which]), p=weights[which]))
    # The two streams stayed in step.
    assert a.random() == b.random()


def test_predict_workload_equals_predicting_every_spec() -> None:
    from predictor.analytical import predict_table
    from scheduler.sim.workload import distinct_rows, predict_workload

    wl = generate_workload(0.3, 2, jobs_per_day=4000)
    first, inverse = distinct_rows(wl)
    assert len(first) < len(wl)  # re-runs share a row
    for i, k in enumerate(inverse.tolist()):
        a, b = wl.specs[i], wl.specs[int(first[k])]
        assert {**a.__dict__, "id": None} == {**b.__dict__, "id": None}
    got, want = predict_workload(wl), predict_table(list(wl.specs))
    assert got.job_ids == want.job_ids and got.method == want.method
    for name in ("peak_vram_gib", "peak_vram_upper_gib", "runtime_s", "runtime_upper_s"):
        assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True)
    for name in ("step_time_s", "ttft_s", "tpot_s", "fits", "busy_frac"):
        assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True)
    for k, v in want.breakdown_gib.items():
        assert np.array_equal(got.breakdown_gib[k], v, equal_nan=True)
