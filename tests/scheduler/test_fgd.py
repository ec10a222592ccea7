"""FGD fragmentation maths against a direct transcription of the simulator's definition."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.policies.fgd import (
    TaskClasses,
    fgd_score,
    fragmentation_after_share,
    fragmentation_after_whole,
    node_fragmentation,
    typical_task_classes,
)


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
