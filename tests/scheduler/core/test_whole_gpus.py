"""Shared nodes that also serve whole GPUs (``whole_gpus = true``): shares and gangs on one node,
never on the same GPU."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import PlacementError, PoolError
from scheduler.policies.registry import get_policy

MIXED = {
    "nodes": [
        {"name": "m0", "gpu": "H100-80GB", "count": 4, "mode": "shared", "whole_gpus": True},
    ]
}


def _req(job_id: str, upper: float, n: int = 1) -> PlacementRequest:
    return PlacementRequest(job_id, [upper] * 5, [upper] * 5, [60.0] * 5, [60.0] * 5, n_gpus=n)


def test_whole_gpus_needs_a_shared_node_and_round_trips() -> None:
    with pytest.raises(PoolError, match="whole_gpus = true needs mode"):
        Pool.from_dict({"nodes": [{"name": "w", "gpu": "H100-80GB", "whole_gpus": True}]})
    pool = Pool.from_dict(MIXED)
    assert [pool.class_label(c) for c in range(pool.n_classes)] == ["H100-80GB", "shared H100-80GB"]
    assert Pool.from_dict(pool.to_dict()).to_dict() == pool.to_dict()


def test_a_gang_takes_only_gpus_no_share_holds() -> None:
    pool = Pool.from_dict(MIXED)
    state = pool.state()
    pol = get_policy("firstfit")
    # rightsize takes the cheaper share; firstfit then places the gangs.
    small = get_policy("rightsize").schedule([_req("s", 10.0)], state, 0.0)[0]
    assert small.state == "placed" and small.chosen_option is not None
    assert small.chosen_option.kind == "shared"
    share_gpu = small.chosen_option.gpu_indices[0]
    gang = pol.schedule([_req("g", 60.0, n=3)], state, 0.0)[0]
    assert gang.state == "placed" and gang.chosen_option is not None
    assert share_gpu not in gang.chosen_option.gpu_indices
    # Every GPU now holds something: a fourth whole GPU is not there, and no share fits on the
    # gang's GPUs (the one with the first share still has room).
    assert pol.schedule([_req("g2", 60.0, n=1)], state.copy(), 0.0)[0].chosen_option.kind == (
        "shared"
    )
    assert pol.schedule([_req("g3", 60.0, n=2)], state, 0.0)[0].state == "pending"
    held = state.busy
    assert held.sum() == 3 and not held[share_gpu]
    state.assert_consistent()


def test_allocate_refuses_a_whole_gpu_under_a_share() -> None:
    pool = Pool.from_dict(MIXED)
    state = pool.state()
    pol = get_policy("firstfit")
    d = get_policy("rightsize").schedule([_req("s", 10.0)], state, 0.0)[0]
    assert d.chosen_option is not None
    g = d.chosen_option.gpu_indices[0]
    gang = pol.schedule([_req("g", 60.0, n=4)], state.copy(), 0.0)[0]
    assert gang.state == "pending"
    free = [i for i in range(4) if i != g]
    whole = pol.schedule([_req("w", 60.0, n=3)], state, 0.0)[0]
    assert whole.chosen_option is not None
    assert sorted(whole.chosen_option.gpu_indices) == free
    state.release("w")
    forged = whole.chosen_option
    forged.gpu_indices = (g, *free[:2])
    with pytest.raises(PlacementError, match="not all idle"):
        state.allocate(forged, "forged")
    assert np.array_equal(state.busy, np.zeros(4, bool))
    assert int(state.shared_count[g]) == 1
