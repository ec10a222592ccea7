from __future__ import annotations

import numpy as np
import pytest

from scheduler.sim.outcomes import AttemptRecords, JobRecords, compute_metrics


def test_metrics_from_hand_built_records() -> None:
    jobs = JobRecords(
        arrival_s=np.array([0.0, 0.0, 10.0]),
        first_start_s=np.array([0.0, 5.0, np.nan]),
        end_s=np.array([100.0, 205.0, np.nan]),
        oom_kills=np.array([0, 1, 0]),
        rejected=np.array([False, False, True]),
        smallest_fit=np.array([True, False, False]),
        reserved_gib=np.array([11.0, 20.0, np.nan]),
        true_peak_gib=np.array([10.0, 10.0, np.nan]),
    )
    attempts = AttemptRecords(
        duration_s=np.array([100.0, 50.0, 150.0]),
        cost_usd=np.array([1.0, 0.5, 1.5]),
        gpu_hours=np.array([0.5, 0.25, 0.75]),
        slot_gib=np.array([20.0, 20.0, 40.0]),
        used_gib=np.array([10.0, 30.0, 10.0]),
    )
    m = compute_metrics(jobs, attempts, pool_gpus=2, placement_seconds=0.5, n_placements=3)
    assert m.cost_usd == pytest.approx(3.0)
    assert m.gpu_hours == pytest.approx(1.5)
    assert m.reserved_over_actual_median == pytest.approx(1.55)
    assert m.oom_kills == 1 and m.oom_kill_rate == pytest.approx(1 / 3)
    assert m.n_rejected == 1 and m.n_finished == 2
    assert m.smallest_fit_rate == pytest.approx(0.5)
    assert m.makespan_s == pytest.approx(205.0)
    assert m.queue_delay_p50_s == pytest.approx(2.5)
    assert m.placements_per_s == pytest.approx(6.0)
    # held 100*20 + 50*20 + 150*40 = 9000; used 1000 + 1000 (capped) + 1500 = 3500
    assert m.stranded_vram_frac == pytest.approx(1 - 3500 / 9000)
    d = m.to_dict()
    assert d["cost_usd"] == 3.0
