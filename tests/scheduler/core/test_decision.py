"""Decision/Option records survive JSON exactly, and lazy option lists match eager ones."""

from __future__ import annotations

import json

import pytest

from scheduler.core.decision import Decision, Option
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import SchedulerError
from scheduler.policies.rightsize import RightSizePolicy
from tests.placement import option


def _option(**kw: object) -> Option:
    """A fitting MIG slice with every optional field set (the round trip covers them)."""
    fields = {"kind": "mig", "mig_start": 6, "leftover_gib": 0.5, **kw}
    return option("A100-80GB", 0.1 + 0.2, **fields)


def test_option_round_trip_is_exact_through_json() -> None:
    o = _option()
    back = Option.from_dict(json.loads(json.dumps(o.to_dict())))
    assert back == o
    assert back.cost_usd == 0.1 + 0.2  # floats survive bit for bit


def test_unknown_figures_become_null() -> None:
    o = _option(runtime_s=None, cost_usd=None, fits_now=False, gpu_indices=(), node=None)
    d = o.to_dict()
    assert d["runtime_s"] is None and d["gpu_indices"] == []
    assert Option.from_dict(json.loads(json.dumps(d))) == o


def test_decision_round_trip_is_exact() -> None:
    d = Decision(
        job_id="j1",
        policy="rightsize",
        state="placed",
        options=[_option(), _option(kind="whole", mig_profile=None, mig_start=None, n_gpus=2)],
        chosen=0,
        reason="cheapest",
        runner_up=1,
        time_s=12.25,
    )
    back = Decision.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back == d
    assert back.chosen_option == d.options[0]


def test_bad_records_are_rejected_with_the_problem() -> None:
    with pytest.raises(SchedulerError, match="unknown keys"):
        Option.from_dict({**_option().to_dict(), "bogus": 1})
    with pytest.raises(SchedulerError, match="kind must be one of"):
        Option.from_dict({**_option().to_dict(), "kind": "half"})
    good = Decision("j", "p", "pending").to_dict()
    with pytest.raises(SchedulerError, match="state must be one of"):
        Decision.from_dict({**good, "state": "lost"})
    with pytest.raises(SchedulerError, match="out of range"):
        Decision.from_dict({**good, "chosen": 3})


def test_lazy_decisions_serialise_like_eager_ones() -> None:
    pool = Pool.from_dict({"nodes": [{"name": "a", "gpu": "A100-40GB", "count": 1}]})
    state = pool.state()
    reqs = [
        PlacementRequest(f"j{k}", [20.0] * 5, [22.0] * 5, [100.0] * 5, [120.0] * 5)
        for k in range(3)
    ]
    decisions = RightSizePolicy(backfill=False).schedule(reqs, state, 0.0)
    assert [d.state for d in decisions] == ["placed", "pending", "pending"]
    for d in decisions:
        again = Decision.from_dict(json.loads(json.dumps(d.to_dict())))
        assert again == d
        assert again.reason == d.reason != ""
    assert decisions[1].reason == "waiting: insufficient free A100-40GB: 1 more needed"
