"""Lookahead: the waste-to-go maths, the decision it implies on a tiny pool, and that it stays
online (the mix read from the queue when none is given)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.loop import SchedulerCore
from scheduler.exceptions import PolicyError
from scheduler.policies._lookahead_maths import per_gpu_sizes, waste_to_go
from scheduler.policies._node_scorers import NodeView, PodShape, make_fgd, state_key
from scheduler.policies._stranding_maths import DemandRatios
from scheduler.policies.fgd import TaskClasses, class_terms, fragmentation_from_terms
from scheduler.policies.lookahead import LookaheadPolicy, lookahead_for_mix, make_lookahead
from scheduler.policies.registry import PolicyName, get_policy
from scheduler.sim.openb.pool import openb_pool, openb_requests
from scheduler.sim.openb.replay import replay
from scheduler.sim.openb.trace import OpenbCluster, OpenbWorkload

FULL = 1000


def test_no_arrival_leaves_every_gap_as_it_is() -> None:
    v = waste_to_go(np.array([500]), 0, FULL)
    assert np.array_equal(v, np.arange(FULL + 1))


def test_each_arrival_that_fits_takes_its_size() -> None:
    # Every task asks 500: a full GPU is half taken after one arrival, closed after two; a gap
    # under 500 never changes.
    v1, v2 = waste_to_go(np.array([500]), 1, FULL), waste_to_go(np.array([500]), 2, FULL)
    assert v1[1000] == 500 and v2[1000] == 0
    assert v1[499] == v2[499] == 499 and v1[700] == 200


def test_tasks_that_never_fit_a_gap_only_dilute_the_mix() -> None:
    # Half the mix is CPU-only (size 0): one arrival closes the 500 gap half of the time.
    sizes = per_gpu_sizes(np.array([1, 0]), np.array([500, 0]), FULL)
    assert sizes.tolist() == [500, 0]
    assert waste_to_go(sizes, 1, FULL)[500] == pytest.approx(250.0)


def test_multi_gpu_tasks_count_as_whole_gpus() -> None:
    assert per_gpu_sizes(np.array([8, 1, 1]), np.array([1000, 1000, 250]), FULL).tolist() == [
        1000,
        1000,
        250,
    ]


def test_bad_depth_or_mix_is_refused() -> None:
    with pytest.raises(ValueError, match="k must be >= 0"):
        waste_to_go(np.array([500]), -1, FULL)
    with pytest.raises(ValueError, match="at least one task"):
        waste_to_go(np.array([], np.int64), 4, FULL)
    with pytest.raises(PolicyError, match="arrivals must be a whole number"):
        LookaheadPolicy(arrivals=2.5)  # type: ignore[arg-type]


# The mix of the decision tests: 60% whole-GPU tasks, 20% 470 shares, 15% 680, 5% 320, nothing
# smaller. A 210 gap (470 + 320 on one GPU) can never close; a 530 gap waits for the next 470,
# a 680 gap for the next 680.
MIX_MILLI = np.array([1000] * 12 + [470] * 4 + [680] * 3 + [320])
NO_STRANDING = DemandRatios(cpu_per_gpu=0.0, mem_per_gpu=0.0)


def _view() -> NodeView:
    """Two one-GPU nodes: n0 holds a 470 share (530 free), n1 is idle."""
    return NodeView(
        cpu_free=np.array([64_000, 64_000]),
        mem_free=np.array([262_144, 262_144]),
        gpu_free=np.array([[530], [1000]]),
        tags=np.zeros((2, 6), np.int64),
        n_gpu=np.array([1, 1]),
    )


def test_a_share_that_would_leave_a_dead_gap_opens_an_idle_gpu_instead() -> None:
    """A 320 share: FGD fills the 530 gap (most next tasks fit neither 530 nor 210, and the idle
    GPU would stop fitting the whole-GPU ones), leaving 210 that nothing in the mix fits.
    Looking ahead, a later 470 closes the 530 gap and a later 680 the idle GPU's 680, so the
    share opens the idle GPU."""
    pod = PodShape(cpu=1000, mem=1024, num_gpu=1, milli=320)
    rng = np.random.default_rng(0)
    idx = np.array([0, 1])

    view = _view()
    view.key = state_key(view, slice(None), True)
    value = waste_to_go(per_gpu_sizes(np.ones(MIX_MILLI.size, np.int64), MIX_MILLI, FULL), 64, FULL)
    ours, _ = make_lookahead(NO_STRANDING, value)(view, idx, pod, rng)
    assert value[530] - value[210] < value[1000] - value[680]  # the rule's own reason
    assert int(np.argmax(ours)) == 1

    classes = TaskClasses(
        cpu=np.full(4, 1000.0),
        gpu_per_gpu=np.array([1000.0, 470.0, 680.0, 320.0]),
        num_gpu=np.ones(4, np.int64),
        weight=np.array([0.6, 0.2, 0.15, 0.05]),
    )
    fgd_view = _view()
    terms = class_terms(fgd_view.gpu_free, classes)
    fgd_view.fgd = (*terms, fragmentation_from_terms(*terms, fgd_view.cpu_free * 1.0, classes))
    fgd_view.key = state_key(fgd_view, slice(None), False)
    fgd, _ = make_fgd(classes)(fgd_view, idx, pod, rng)
    assert int(np.argmax(fgd)) == 0


def _tiny_openb(milli: list[int]) -> tuple[OpenbCluster, OpenbWorkload]:
    cluster = OpenbCluster(
        names=("n0", "n1"),
        cpu_milli=np.array([64_000, 64_000]),
        memory_mib=np.array([262_144, 262_144]),
        n_gpu=np.array([1, 1]),
        model=("G2", "G2"),
    )
    n = len(milli)
    pods = OpenbWorkload(
        cpu_milli=np.full(n, 1000),
        memory_mib=np.full(n, 1024),
        num_gpu=np.ones(n, np.int64),
        gpu_milli=np.array(milli),
        gpu_spec=tuple(frozenset() for _ in range(n)),
    )
    return cluster, pods


def test_the_live_policy_places_the_share_on_the_idle_gpu() -> None:
    cluster, pods = _tiny_openb([470, 320])
    op = openb_pool(cluster)
    sizes = per_gpu_sizes(np.ones(MIX_MILLI.size, np.int64), MIX_MILLI, FULL)
    core = SchedulerCore(op.pool.state(), get_policy(PolicyName.LOOKAHEAD, sizes=sizes))
    nodes = []
    for i, req in enumerate(openb_requests(pods, op)):
        core.submit(req)
        (d,) = core.tick(float(i))
        assert d.state == "placed" and d.chosen_option is not None
        nodes.append(d.chosen_option.node)
    # The 470 takes the first node (a tie between idle GPUs); the 320 does not join it.
    assert nodes == ["n0", "n1"]
    assert d.reason.startswith("highest lookahead score")


def test_without_a_mix_it_reads_the_queue_and_still_places_each_job() -> None:
    cluster, pods = _tiny_openb([470, 320, 1000])
    op = openb_pool(cluster)
    core = SchedulerCore(op.pool.state(), get_policy(PolicyName.LOOKAHEAD, seed=1))
    for req in openb_requests(pods, op):
        core.submit(req)
    states = [d.state for d in core.tick(0.0)]
    assert states.count("placed") == 2 and "rejected" not in states
    core.state.assert_consistent()


def test_a_mix_learned_from_cpu_only_arrivals_strands_nothing() -> None:
    """Learning online, the first arrivals may all be CPU-only: no ratio to strand by, and no
    arrival that fits a gap, so every gap keeps what it has and each GPU scores the share's
    own size; the node order decides."""
    score = lookahead_for_mix(
        np.array([8000]), np.array([4096]), np.array([0]), np.array([0]), arrivals=4
    )
    view = _view()
    view.key = state_key(view, slice(None), True)
    pod = PodShape(cpu=1000, mem=1024, num_gpu=1, milli=320)
    s, gpu = score(view, np.array([0, 1]), pod, np.random.default_rng(0))
    assert s.tolist() == [320.0, 320.0] and gpu.tolist() == [0, 0]


def test_the_replay_can_learn_the_mix_from_the_pods_seen_so_far() -> None:
    cluster, pods = _tiny_openb([470, 320, 1000, 470])
    learned = replay(cluster, pods, "lookahead", seed=3, learn_every=1)
    given = replay(cluster, pods, "lookahead", seed=3)
    assert learned.n_pods == given.n_pods >= len(pods)  # tuned up towards 130% of 2 GPUs
    assert learned.allocated_pct[-1] <= 100.0
    assert ((learned.placed_node >= 0).sum()) == learned.n_pods - learned.n_failed
