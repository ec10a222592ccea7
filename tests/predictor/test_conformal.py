import numpy as np
import pytest

from predictor.conformal import ConformalUpper, conformal_quantile, task_family
from predictor.exceptions import DataError, NotFittedError


def test_quantile_uses_the_finite_sample_rank():
    s = np.arange(1, 20, dtype=float)  # n = 19 → k = ceil(20 · 0.9) = 18
    assert conformal_quantile(s, 0.9) == 18.0
    assert conformal_quantile(s[:3], 0.95) == 3.0  # too few scores: the max


def test_coverage_holds_on_exchangeable_data():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=2000)
    fams = ["training"] * 2000
    c = ConformalUpper(coverage=0.95).fit(scores[:1000], fams[:1000])
    q = c.log_margin(["training"])[0]
    assert 0.91 < np.mean(scores[1000:] <= q) < 0.99


def test_small_families_borrow_pooled_scores_and_state_round_trips():
    c = ConformalUpper(0.9, min_scores=10).fit(
        [0.1] * 30 + [2.0] * 3, ["training"] * 30 + ["peft"] * 3
    )
    assert c.quantiles_["peft"] == pytest.approx(c.pooled_quantile_)
    c99 = ConformalUpper.from_state(c.state(), coverage=0.99)
    assert c99.quantiles_["training"] >= c.quantiles_["training"]
    assert task_family("qlora") == "peft"


def test_unfitted_raises():
    with pytest.raises(NotFittedError):
        ConformalUpper().upper(np.ones(1), ["training"])


def test_a_small_family_borrows_its_own_base_before_every_family() -> None:
    """20 traced scores (enough for the 95% rank) and 5 wild analytical ones: the traced
    families' bound comes from traced scores only; a base below 19 scores borrows them all."""
    traced = list(np.linspace(0.0, 0.1, 20))
    c = ConformalUpper(0.95).fit(
        traced + [1.0] * 5, ["peft@traced"] * 10 + ["inference@traced"] * 10 + ["peft"] * 5
    )
    assert c.quantiles_["peft@traced"] == pytest.approx(0.1)  # rank 20 of 20 traced
    assert c.quantiles_["inference@traced"] == pytest.approx(0.1)
    assert c.quantiles_["peft"] == pytest.approx(1.0)  # 5 analytical scores: all 25 pooled
    few = ConformalUpper(0.95).fit(traced[:18] + [1.0] * 5, ["peft@traced"] * 18 + ["peft"] * 5)
    assert few.quantiles_["peft@traced"] == pytest.approx(1.0)


def test_source_weighted_quantile_gives_each_source_one_unit() -> None:
    from predictor.conformal import source_weighted_quantile

    # 38 rows of one source at 0.01 and one row each of 19 others at 0.10..0.28: row-weighted,
    # the big source sets the 95% quantile; by source it is one of 20, so the others count.
    scores = np.r_[np.full(38, 0.01), np.linspace(0.10, 0.28, 19)]
    groups = ["big"] * 38 + [f"s{i}" for i in range(19)]
    assert conformal_quantile(scores, 0.95) == pytest.approx(0.27)
    # cumulative mass 1 + k over the small sources; it must reach 0.95 x 21 = 19.95
    assert source_weighted_quantile(scores, groups, 0.95) == pytest.approx(0.28)
    assert source_weighted_quantile(scores, groups, 0.5) == pytest.approx(0.19)
    with pytest.raises(DataError):
        source_weighted_quantile(np.array([np.nan]), ["a"], 0.95)
