"""FGD fragmentation maths against a direct transcription of the simulator's definition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.core.decision import Decision
from scheduler.core.pool import Pool, load_pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.table import OptionTable
from scheduler.policies.fgd import (
    TaskClasses,
    fgd_score,
    fragmentation_after_share,
    fragmentation_after_whole,
    fragmentation_increase,
    node_fragmentation,
    typical_task_classes,
)
from scheduler.policies.registry import get_policy

REPO = Path(__file__).resolve().parents[3]


def _naive(gpu_free: np.ndarray, cpu: float, cl: TaskClasses) -> float:
    total = gpu_free.sum()
    frag = 0.0
    for c, m, n, w in zip(cl.cpu, cl.gpu_per_gpu, cl.num_gpu, cl.weight, strict=True):
        if m == 0:
            frag += w * total
        elif (gpu_free >= m).sum() >= n and cpu >= c:
            frag += w * gpu_free[gpu_free < m].sum()
        else:
            frag += w * total
    return float(frag)


@pytest.fixture
def setup() -> tuple[TaskClasses, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    milli = rng.choice([0, 250, 500, 1000], 300)
    num = np.where(milli == 1000, rng.choice([1, 2], 300), np.where(milli == 0, 0, 1))
    cl = typical_task_classes(rng.choice([4000, 8000, 16000], 300), milli, num)
    gpu = rng.choice([0, 100, 250, 500, 750, 1000], (40, 8)).astype(float)
    cpu = rng.choice([0, 4000, 8000, 20000], 40).astype(float)
    return cl, gpu, cpu


def test_typical_classes_cover_threshold_and_normalise() -> None:
    cl = typical_task_classes(np.array([1, 1, 1, 2]), np.array([0, 0, 0, 500]), np.array([0] * 4))
    assert cl.weight.sum() == pytest.approx(1.0)
    assert len(cl) == 2  # 75% < 95%, so the rare shape is kept too


def test_node_fragmentation_matches_definition(setup) -> None:
    cl, gpu, cpu = setup
    got = node_fragmentation(gpu, cpu, cl)
    want = [_naive(gpu[i], cpu[i], cl) for i in range(len(gpu))]
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_share_increment_matches_recompute(setup) -> None:
    cl, gpu, cpu = setup
    after = fragmentation_after_share(gpu, cpu, cl, 250.0, 4000.0)
    for i in range(len(gpu)):
        for g in range(8):
            if gpu[i, g] >= 250:
                g2 = gpu[i].copy()
                g2[g] -= 250
                assert after[i, g] == pytest.approx(_naive(g2, cpu[i] - 4000, cl))
            else:
                assert np.isinf(after[i, g])


def test_whole_increment_matches_recompute(setup) -> None:
    cl, gpu, cpu = setup
    after = fragmentation_after_whole(gpu, cpu, cl, 2, 4000.0, 1000.0)
    for i in range(len(gpu)):
        free = np.flatnonzero(gpu[i] >= 1000)
        if free.size >= 2:
            g2 = gpu[i].copy()
            g2[free[:2]] = 0
            assert after[i] == pytest.approx(_naive(g2, cpu[i] - 4000, cl))
        else:
            assert np.isinf(after[i])


def test_score_prefers_smaller_increase() -> None:
    s = fgd_score(np.array([100.0, 100.0, 100.0]), np.array([50.0, 400.0, np.inf]), 1000.0)
    assert s[0] > 50 > s[1] > s[2]


# -- the policy on our pools ------------------------------------------------------------------

SHARED = {"nodes": [{"name": "s", "gpu": "H100-80GB", "count": 2, "mode": "shared"}]}


def _req(job_id: str, upper: float, n: int = 1) -> PlacementRequest:
    rt = np.full(5, 3600.0)
    return PlacementRequest(job_id, [upper * 0.9] * 5, [upper] * 5, rt, rt, n_gpus=n)


def _gpu_of(decisions: list[Decision], job_id: str) -> int:
    d = next(d for d in decisions if d.job_id == job_id)
    assert d.state == "placed" and d.chosen_option is not None
    return int(d.chosen_option.gpu_indices[0])


def test_fgd_keeps_room_for_the_popular_shape_where_bestfit_packs() -> None:
    pool = Pool.from_dict(SHARED)
    state = pool.state()
    policy = get_policy("fgd")
    # GPU 0 keeps ~30 GiB free, GPU 1 ~40 GiB: both hold one more 30 GiB job.
    first = policy.schedule([_req("a", 49.0), _req("b", 39.0)], state, 0.0)
    assert {_gpu_of(first, "a"), _gpu_of(first, "b")} == {0, 1}
    full, roomy = _gpu_of(first, "a"), _gpu_of(first, "b")
    # The queue is mostly 30 GiB jobs; a 9 GiB job on the fuller GPU would strand it (< 30
    # left), so FGD sends it to the roomier one, where 30 GiB still fits afterwards.
    queue = [_req("small", 9.0)] + [_req(f"w{i}", 30.0) for i in range(6)]
    bf = get_policy("bestfit").schedule(queue[:1], state.copy(), 0.0)
    assert _gpu_of(bf, "small") == full
    got = policy.schedule(queue, state, 0.0)
    assert _gpu_of(got, "small") == roomy
    placed = [d.job_id for d in got if d.state == "placed"]
    assert placed == ["small", "w0", "w1"]  # both GPUs still took a 30 GiB job
    state.assert_consistent()


def test_fragmentation_increase_is_inf_where_nothing_fits_and_finite_where_it_does() -> None:
    pool = Pool.from_dict(SHARED)
    state = pool.state()
    cl = typical_task_classes(np.zeros(3), np.array([30.0, 30.0, 10.0]), np.ones(3))
    table = OptionTable(_req("x", 20.0), state)
    inc = fragmentation_increase(table, state, cl)
    assert np.isfinite(inc[table.fits_now]).all()
    assert np.isinf(inc[~table.fits_now]).all()


def test_fgd_policy_on_the_mixed_pool_never_overcommits() -> None:
    pool = load_pool(REPO / "datasets" / "pools" / "mixed.toml")
    state = pool.state()
    rng = np.random.default_rng(1)
    jobs = [
        _req(f"j{k}", float(min(rng.lognormal(2.6, 0.9), 170.0)), int(rng.choice([1, 1, 2, 4])))
        for k in range(60)
    ]
    ds = get_policy("fgd").schedule(jobs, state, 0.0)
    assert len(ds) == len(jobs)
    for d in ds:
        if d.state == "placed":
            o = d.chosen_option
            assert o is not None and o.fits_now
            assert (
                o.reserved_gib
                >= float(next(j for j in jobs if j.job_id == d.job_id).vram_upper_gib[0]) - 1e-3
            )
    state.assert_consistent()
    assert (state.used_mib <= pool.capacity_mib).all()
