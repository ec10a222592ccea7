"""The retraining gate's two tests (predictor._retrain_cv) on residuals whose answer is known:
drawn from one distribution (exchangeable: no rejection), shifted (rejection), and a candidate
that is worse on the old rows in every source group (rejection by the paired test alone)."""

from __future__ import annotations

from typing import Any

import numpy as np

from predictor._retrain_cv import ALPHA, consistency_p, no_worse, worse_p


def _residuals(shift: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """60 old rows' residuals (the band's scores) and 12 new rows' (the node's), the new ones
    drawn from the same spread plus ``shift``."""
    rng = np.random.default_rng(seed)
    r = np.concatenate([rng.normal(0, 0.1, 60), rng.normal(shift, 0.1, 12)])
    mine = np.arange(72) >= 60
    return r, mine, ~mine


def test_consistency_rejects_a_shifted_node_and_not_an_exchangeable_one() -> None:
    strata = np.array(["pooled"] * 72)
    assert consistency_p(*_residuals(0.7), strata) <= 0.001  # a doubled reading: log 2
    assert consistency_p(*_residuals(-0.9), strata) <= 0.001  # too low counts as well
    # Exchangeable rows: p-values spread over (0, 1], rarely small.
    ps = [consistency_p(*_residuals(0.0, seed=s), strata) for s in range(40)]
    assert np.mean(np.array(ps) <= 0.05) <= 0.15 and max(ps) > 0.5


def test_consistency_ranks_within_strata() -> None:
    # The node ran only training jobs, whose errors are larger than inference's; against its
    # own family's scores it is consistent, against the pooled scores it would not be.
    rng = np.random.default_rng(1)
    fam = np.array(["inference"] * 40 + ["training"] * 30 + ["training"] * 10)
    r = np.concatenate([rng.normal(0, 0.03, 40), rng.normal(0, 0.3, 30), rng.normal(0, 0.3, 10)])
    mine = np.arange(80) >= 70
    assert consistency_p(r, mine, ~mine, fam) > 0.05
    assert consistency_p(r, mine, ~mine, np.array(["pooled"] * 80)) <= 0.05


def test_paired_test_sees_a_candidate_worse_in_every_source_group() -> None:
    groups = np.repeat([f"s{i}" for i in range(12)], 5)
    rng = np.random.default_rng(2)
    assert worse_p(0.02 + rng.normal(0, 0.01, 60), groups) <= 0.001
    assert worse_p(rng.normal(0, 0.01, 60), groups) > 0.01
    assert worse_p(-0.02 + rng.normal(0, 0.01, 60), groups) > 0.5  # better is never "worse"


def _cv(node_p: float, worse: float) -> dict[str, dict[str, Any]]:
    return {
        "peak_vram_gib": {
            "old_candidate_mape": 0.16,
            "old_incumbent_mape": 0.15,
            "candidate_mape": 0.15,
            "calibration_median_abs_residual": 0.06,
            "worse_p": worse,
            "nodes": {"snugfit node n0": {"p": node_p, "median_abs_residual": 0.7}},
        }
    }


def test_no_worse_splits_alpha_over_the_tests_and_names_what_failed() -> None:
    level = ALPHA / 2  # one node group and the paired test
    ok, why = no_worse(_cv(node_p=level * 1.01, worse=0.5))
    assert ok, why
    ok, why = no_worse(_cv(node_p=level, worse=0.5))
    assert not ok and "snugfit node n0" in why and "calibrated residuals" in why
    ok, why = no_worse(_cv(node_p=0.5, worse=0.001))
    assert not ok and "worse on the old rows" in why and "16.00% vs 15.00%" in why
    assert not no_worse({})[0]
