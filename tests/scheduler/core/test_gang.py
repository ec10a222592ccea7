"""Multi-node gangs (core.gang and its use in options, table, binding, state): a job larger than
any node of its type spans several nodes of that type with an equal share on each, all or
nothing, TP inside a node, fewest racks first; refusals say how many nodes it needed."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.decision import Decision
from scheduler.core.gang import shares
from scheduler.core.loop import SchedulerCore
from scheduler.core.options import enumerate_options
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.exceptions import PlacementError
from scheduler.policies.registry import get_policy
from tests.jobs import gang_finetune_spec
from tests.placement import flat_request


def _pool(*nodes: tuple[str, int, str | None], gpu: str = "H100-80GB") -> Pool:
    rows: list[dict[str, Any]] = []
    for name, count, rack in nodes:
        row: dict[str, Any] = {"name": name, "gpu": gpu, "count": count}
        if rack is not None:
            row["rack"] = rack
        rows.append(row)
    return Pool.from_dict({"name": "gang", "nodes": rows})


def _req(job_id: str, n: int, *, tp: int = 1, upper: float = 60.0, **kw: Any) -> PlacementRequest:
    return flat_request(job_id, upper, n, runtime_upper=4000.0, tensor_parallel=tp, **kw)


def _tick(state: PoolState, *reqs: PlacementRequest) -> dict[str, Decision]:
    core = SchedulerCore(state, get_policy("rightsize"))
    for r in reqs:
        core.submit(r)
    return {d.job_id: d for d in core.tick(0.0)}


def test_shares_are_divisors_holding_whole_tensor_parallel_groups() -> None:
    assert shares(16, 1, 8) == [8, 4, 2, 1]
    assert shares(16, 4, 8) == [8, 4]
    assert shares(24, 8, 8) == [8]
    assert shares(16, 16, 8) == []


def test_16_gpu_gang_spans_two_8_gpu_nodes_with_node_zero_first() -> None:
    pool = _pool(("h0", 8, None), ("h1", 8, None), ("h2", 8, None))
    state = pool.state()
    d = _tick(state, _req("big", 16, tp=8))["big"]
    assert d.state == "placed"
    opt = d.chosen_option
    assert opt is not None
    assert opt.label == "H100-80GB x16 (2 nodes)"
    assert opt.n_nodes == 2 and opt.n_gpus == 16
    nodes = [int(pool.gpu_node[g]) for g in opt.gpu_indices]
    # Rank order: the first node's eight GPUs, then the second's.
    assert nodes[:8] == [nodes[0]] * 8 and nodes[8:] == [nodes[8]] * 8 and nodes[0] != nodes[8]
    assert opt.node == pool.nodes[nodes[0]].name
    # CPUs and host memory: each node gives its whole share (8 of 8 GPUs).
    assert opt.cpus == pool.nodes[0].cpus
    assert state.option_of("big") is opt
    state.assert_consistent()
    assert state.node_cpu_milli.tolist().count(int(pool.nodes[0].cpus * 1000)) == 2
    state.release("big")
    state.assert_consistent()
    assert not state.busy.any() and not state.node_cpu_milli.any()


def test_gang_is_refused_while_only_one_node_is_free_and_says_so() -> None:
    pool = _pool(("h0", 8, None), ("h1", 8, None))
    state = pool.state()
    assert _tick(state, _req("small", 1))["small"].state == "placed"
    d = _tick(state, _req("big", 16, tp=8))["big"]
    assert d.state == "pending"
    assert not state.busy[[g for g in range(16)]].sum() > 1
    h100 = next(o for o in d.options if o.gpu_type == "H100-80GB")
    assert not h100.fits_now and h100.fits_empty
    assert h100.reason == "needs 16 GPUs of H100-80GB across 2 nodes; only 1 node has 8 free"
    state.release("small")
    assert _tick(state, _req("big", 16, tp=8))["big"].state == "placed"


def test_gang_larger_than_the_pool_is_rejected_with_the_node_count() -> None:
    pool = _pool(("h0", 8, None))
    d = _tick(pool.state(), _req("big", 16, tp=8))["big"]
    assert d.state == "rejected"
    h100 = next(o for o in d.options if o.gpu_type == "H100-80GB")
    assert h100.reason == (
        "H100-80GB: needs 16 GPUs of H100-80GB across 2 nodes of 8 GPUs; "
        "only 1 whole H100-80GB node has 8 GPUs"
    )


def test_tensor_parallel_wider_than_a_node_cannot_gang() -> None:
    pool = _pool(("h0", 8, None), ("h1", 8, None))
    d = _tick(pool.state(), _req("tp16", 16, tp=16))["tp16"]
    assert d.state == "rejected"
    h100 = next(o for o in d.options if o.gpu_type == "H100-80GB")
    assert "tensor_parallel=16" in h100.reason


def test_smaller_shares_take_partly_used_nodes_when_tp_allows() -> None:
    # Eight nodes with 2 of 8 GPUs free each: a TP=2 gang of 16 goes 2 per node on all eight.
    pool = _pool(*((f"h{k}", 8, None) for k in range(8)))
    state = pool.state()
    for k in range(8):
        assert _tick(state, _req(f"s{k}", 6))[f"s{k}"].state == "placed"
    d = _tick(state, _req("big", 16, tp=2))["big"]
    assert d.state == "placed"
    opt = d.chosen_option
    assert opt is not None and opt.n_nodes == 8
    # Each node gives a quarter of its CPUs (2 of 8 GPUs).
    assert opt.cpus == pool.nodes[0].cpus / 4
    state.assert_consistent()
    # TP=4 cannot use nodes with 2 free.
    state.release("big")
    d = _tick(state, _req("big4", 16, tp=4))["big4"]
    assert d.state == "pending"
    h100 = next(o for o in d.options if o.gpu_type == "H100-80GB")
    assert h100.reason == "needs 16 GPUs of H100-80GB across 2 nodes; only 0 nodes have 8 free"


def test_gang_prefers_one_rack_over_fewer_free_nodes_elsewhere() -> None:
    pool = _pool(("a0", 8, "A"), ("b0", 8, "B"), ("b1", 8, "B"), ("a1", 8, "A"), ("c0", 8, "C"))
    state = pool.state()
    # Fill a1 so rack A has one free node; rack B has two.
    assert _tick(state, _req("fill", 8))["fill"].state == "placed"
    held = {pool.nodes[int(pool.gpu_node[g])].name for g in state.option_of("fill").gpu_indices}
    d = _tick(state, _req("big", 16, tp=8))["big"]
    opt = d.chosen_option
    assert opt is not None
    racks = {pool.nodes[int(pool.gpu_node[g])].rack for g in opt.gpu_indices}
    assert len(racks) == 1, (held, racks)


def test_gang_across_racks_when_no_rack_holds_it() -> None:
    pool = _pool(("a0", 8, "A"), ("b0", 8, "B"))
    d = _tick(pool.state(), _req("big", 16, tp=8))["big"]
    assert d.state == "placed"


def test_single_node_option_spanning_nodes_is_refused_by_the_state() -> None:
    from dataclasses import replace

    pool = _pool(("h0", 8, None), ("h1", 8, None))
    state = pool.state()
    opt = next(o for o in enumerate_options(_req("j", 2), state) if o.fits_now)
    forged = replace(opt, gpu_indices=(0, 8))
    with pytest.raises(PlacementError, match="span 2 nodes"):
        state.allocate(forged, "j")
    state.assert_consistent()
    assert len(state) == 0


def test_gang_runtime_charges_the_gradient_all_reduce_over_the_node_network() -> None:
    from predictor.internode import gradient_sync, internode_allreduce_s
    from predictor.spec import JobSpec

    spec = JobSpec.model_validate(gang_finetune_spec("ft"))
    sync = gradient_sync([spec])[0]
    assert sync.data_parallel == 2 and sync.steps == 1000 and sync.charged_s > 0
    # At 8 x 400 Gb/s per node the placement's charge is the predictor's own (a link per GPU);
    # at one 400 Gb/s link per node it is eight times the bytes' time.
    assert internode_allreduce_s(sync, 8, 2, 3200.0) == pytest.approx(sync.charged_s)
    slow = internode_allreduce_s(sync, 8, 2, 400.0)
    assert slow > 7 * sync.charged_s

    def runtime(gbps: float) -> float:
        nodes = [
            {"name": f"h{k}", "gpu": "H100-80GB", "count": 8, "network_gbps": gbps}
            for k in range(2)
        ]
        pool = Pool.from_dict({"nodes": nodes})
        req = _req("ft", 16, tp=8, sync=sync)
        opt = next(o for o in enumerate_options(req, pool.state()) if o.gpu_type == "H100-80GB")
        assert opt.n_nodes == 2 and opt.runtime_s is not None
        return opt.runtime_s

    assert runtime(3200.0) == pytest.approx(3600.0)
    assert runtime(400.0) == pytest.approx(3600.0 - sync.charged_s + slow)
    # Inference replicas do not synchronise: no network term.
    pool = _pool(("h0", 8, None), ("h1", 8, None))
    opt = next(
        o for o in enumerate_options(_req("inf", 16), pool.state()) if o.gpu_type == "H100-80GB"
    )
    assert opt.runtime_s == pytest.approx(3600.0)


def test_pool_file_reads_rack_and_network_and_round_trips() -> None:
    pool = Pool.from_dict(
        {
            "nodes": [
                {"name": "a", "gpu": "H100-80GB", "count": 8, "rack": "r1", "network_gbps": 3200},
                {"name": "b", "gpu": "H100-80GB", "count": 8},
            ]
        }
    )
    a, b = pool.nodes
    assert (a.rack, a.network_gbps) == ("r1", 3200.0)
    assert (b.rack, b.network_gbps) == (None, 400.0)
    d = pool.to_dict()
    assert "rack" not in d["nodes"][1] and "network_gbps" not in d["nodes"][1]
    assert Pool.from_dict(d).nodes == pool.nodes


@pytest.mark.parametrize(
    "policy", ["rightsize", "requested", "firstfit", "bestfit", "easy_backfill", "fgd", "optimal"]
)
def test_every_policy_places_a_gang_beside_a_node_sized_job(policy: str) -> None:
    pool = _pool(("h0", 8, "A"), ("h1", 8, "B"), ("h2", 8, "B"))
    state = pool.state()
    core = SchedulerCore(state, get_policy(policy))
    core.submit(_req("big", 16, tp=8))
    core.submit(_req("eight", 8))
    ds = {d.job_id: d for d in core.tick(0.0)}
    assert ds["big"].state == ds["eight"].state == "placed", {k: d.reason for k, d in ds.items()}
    big = state.option_of("big")
    eight = state.option_of("eight")
    assert big.n_nodes == 2 and not set(big.gpu_indices) & set(eight.gpu_indices)
    state.assert_consistent()


def test_gang_runtime_charges_pipeline_activations_between_its_nodes() -> None:
    from predictor.internode import gradient_sync, internode_pipeline_s
    from predictor.spec import JobSpec

    spec = JobSpec.model_validate(
        gang_finetune_spec("pp", gradient_accumulation=8, pipeline_parallel=2)
    )
    sync = gradient_sync([spec])[0]
    # One data-parallel replica: no gradient all-reduce, only the two stages' activations.
    assert sync.data_parallel == 1 and sync.charged_s == 0.0
    pipe = internode_pipeline_s(sync, 8, 2, 400.0)
    assert pipe > 0.0
    pool = _pool(("h0", 8, None), ("h1", 8, None))
    req = _req("pp", 16, tp=8, sync=sync, pipeline_parallel=2)
    opt = next(o for o in enumerate_options(req, pool.state()) if o.gpu_type == "H100-80GB")
    assert opt.n_nodes == 2 and opt.runtime_s == pytest.approx(3600.0 + pipe)
    # The same pipeline inside one 8-GPU node is not a gang: nothing crosses a network.
    one = _req("pp8", 8, tp=4, sync=sync, pipeline_parallel=2)
    opt8 = next(o for o in enumerate_options(one, pool.state()) if o.gpu_type == "H100-80GB")
    assert opt8.n_nodes == 1 and opt8.runtime_s == pytest.approx(3600.0)
