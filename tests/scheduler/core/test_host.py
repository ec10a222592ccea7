"""CPU cores and host memory as placement resources (core.host and its use in options, table,
state, binding): pool figures and their defaults, a job's share per GPU, the fit rule, and
refusals that name the resource a job lacked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scheduler.core.decision import Decision, Option
from scheduler.core.loop import SchedulerCore
from scheduler.core.options import OptionBatch, enumerate_options
from scheduler.core.pool import Pool, load_pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.exceptions import PlacementError, PoolError
from scheduler.policies.registry import get_policy
from tests.placement import flat_request, node, pool_of

B200_NODE = {"name": "b200-0", "gpu": "B200-180GB", "count": 8}


def _req(job_id: str, upper: float = 20.0, n: int = 1, **kw: object) -> PlacementRequest:
    return flat_request(job_id, upper, n, runtime_upper=4000.0, **kw)


def _tick(pool: Pool, *reqs: PlacementRequest, policy: str = "rightsize") -> dict[str, Decision]:
    core = SchedulerCore(pool.state(), get_policy(policy))
    for r in reqs:
        core.submit(r)
    return {d.job_id: d for d in core.tick(0.0)}


def _bound(req: PlacementRequest, state: PoolState, label: str) -> Option:
    return next(o for o in enumerate_options(req, state) if o.label == label)


# -- the pool: figures, defaults, TOML ---------------------------------------------------------


def test_node_defaults_are_the_dgx_figures_per_gpu_times_the_node_size() -> None:
    pool = pool_of(
        node("h", "H100-80GB", 8),
        node("a", "A100-40GB", 4),
        node("b", "B200-180GB", 8, cpus=224, host_memory_gib=4096),
    )
    h, a, b = pool.nodes
    assert (h.cpus, h.host_memory_gib) == (112, 2048)  # DGX H100: 112 cores, 2 TiB
    assert (a.cpus, a.host_memory_gib) == (64, 512)  # half a DGX A100 320GB (128 cores, 1 TiB)
    assert (b.cpus, b.host_memory_gib) == (224, 4096)  # stated figures win
    assert pool.node_cpu_milli.tolist() == [112_000, 64_000, 224_000]
    assert pool.node_host_mib.tolist() == [2048 * 1024, 512 * 1024, 4096 * 1024]
    # The pool file form carries the resolved figures and reads back to an equal pool.
    again = Pool.from_dict(pool.to_dict())
    assert again.nodes == pool.nodes


def test_pool_toml_reads_cpus_and_host_memory(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        'name = "p"\n[[nodes]]\nname = "n0"\ngpu = "H200-141GB"\ncount = 4\ncpus = 48\n'
        'host_memory_gib = 768.5\n[[nodes]]\nname = "n1"\ngpu = "H200-141GB"\ncount = 2\n'
    )
    pool = load_pool(f)
    assert (pool.nodes[0].cpus, pool.nodes[0].host_memory_gib) == (48, 768.5)
    assert (pool.nodes[1].cpus, pool.nodes[1].host_memory_gib) == (28, 512)


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpus", 0), ("cpus", -4), ("host_memory_gib", 0), ("host_memory_gib", 1e9), ("cpus", "x")],
)
def test_bad_node_figures_are_refused_naming_node_field_and_value(
    field: str, value: object
) -> None:
    with pytest.raises(PoolError) as exc:
        Pool.from_dict({"nodes": [{"name": "n0", "gpu": "H100-80GB", field: value}]})
    msg = str(exc.value)
    assert "node 'n0'" in msg and field in msg and repr(value) in msg


def test_shipped_pools_still_load() -> None:
    root = Path(__file__).resolve().parents[3] / "datasets" / "pools"
    for name in ("mixed.toml", "small.toml"):
        pool = load_pool(root / name)
        assert (pool.node_cpu_milli > 0).all() and (pool.node_host_mib > 0).all()


# -- a job's share -----------------------------------------------------------------------------


def test_default_job_takes_its_nodes_share_per_gpu_slice_or_slot() -> None:
    pool = pool_of(
        node("h", "H100-80GB", 8),
        node("m", "A100-80GB", 4, mode="mig", mig="dynamic"),
        node("s", "H200-141GB", 2, mode="shared", max_shared_jobs=4),
    )
    state = pool.state()
    opts = {o.label: o for o in enumerate_options(_req("j", 9.0, n=2), state) if o.fits_now}
    # Two of eight H100s: a quarter of 112 cores and 2 TiB.
    assert (opts["H100-80GB x2"].cpus, opts["H100-80GB x2"].host_memory_gib) == (28, 512)
    one = {o.label: o for o in enumerate_options(_req("k", 9.0), state) if o.fits_now}
    # A 3g slice: 3/7 of one A100-80GB's share (16 cores, 256 GiB per GPU), floored to a
    # millicore and a MiB.
    mig = one["A100-80GB MIG 3g.40gb"]
    assert mig.cpus == 6.857 and mig.host_memory_gib == pytest.approx(109.714, abs=1e-3)
    # On a shared H200 the job is billed its reservation's share of the GPU's memory, and it
    # takes that share of one GPU's 14 cores and 256 GiB.
    shared = one["H200-141GB shared"]
    frac = 9.0 / shared.capacity_gib
    assert shared.cpus == pytest.approx(14 * frac, abs=1e-3)
    assert shared.host_memory_gib == pytest.approx(256 * frac, abs=1e-3)


def test_shares_fill_a_node_exactly_so_default_jobs_place_as_before() -> None:
    pool = pool_of(
        node("h", "H100-80GB", 8),
        node("m", "A100-80GB", 1, mode="mig", mig="dynamic"),
        node("s", "H200-141GB", 1, mode="shared", max_shared_jobs=3),
    )
    reqs = [_req(f"h{i}", 40.0, gpu="H100-80GB") for i in range(8)]
    reqs += [_req(f"m{i}", 9.0, gpu="A100-80GB") for i in range(7)]  # 7 x 1g.10gb
    reqs += [_req(f"s{i}", 30.0, gpu="H200-141GB") for i in range(3)]
    got = _tick(pool, *reqs)
    assert all(d.state == "placed" for d in got.values()), [
        d.reason for d in got.values() if d.state != "placed"
    ]


def test_predicted_host_memory_raises_the_share_and_a_stated_figure_wins() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    state = pool.state()
    # The share of one B200 is 256 GiB; a 300 GiB estimate raises it, a stated 100 GiB wins.
    raised = enumerate_options(_req("a", host_memory_floor_gib=300.0), state)[0]
    assert raised.host_memory_gib == 300.0 and raised.cpus == 14
    stated = enumerate_options(_req("b", host_memory_gib=100.0, host_memory_floor_gib=300.0), state)
    assert stated[0].host_memory_gib == 100.0


# -- the fit rule and its reasons ---------------------------------------------------------------


def test_job_refused_for_cpu_says_how_many_it_needs_and_how_many_are_free() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    got = _tick(pool, _req("big", cpus=96), _req("small", cpus=24))
    assert got["big"].state == "placed"
    d = got["small"]
    assert d.state == "pending"
    # Seven B200s are idle: the CPUs are what it lacks.
    assert d.reason.startswith("waiting: B200-180GB: needs 24 CPUs, 16 free on b200-0")
    # Backfill's reservation counts CPUs too: it starts when the 96-core job ends.
    assert d.reason.endswith("reserved B200-180GB x1 on b200-0 from t=3600s")
    [opt] = d.options
    assert not opt.fits_now and opt.fits_empty and opt.reason.endswith("16 free on b200-0")


def test_job_refused_for_host_memory_names_it() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    got = _tick(pool, _req("a", host_memory_gib=1900.0), _req("b", host_memory_gib=200.0))
    assert got["a"].state == "placed"
    assert got["b"].reason.startswith(
        "waiting: B200-180GB: needs 200.0 GiB host memory, 148.0 GiB free on b200-0"
    )


def test_job_larger_than_any_node_is_rejected_naming_the_resource() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE, {"name": "h", "gpu": "H100-80GB", "count": 8}]})
    got = _tick(pool, _req("huge", cpus=300))
    d = got["huge"]
    assert d.state == "rejected"
    assert "B200-180GB: needs 300 CPUs; no B200-180GB node has that many (b200-0 has 112)" in (
        d.reason
    )
    assert "H100-80GB: needs 300 CPUs" in d.reason


def test_a_node_whose_cpus_an_over_share_job_took_refuses_default_jobs() -> None:
    # 100 of 112 cores to one job: the other seven GPUs are idle, but a default job's share
    # (14 cores) no longer fits there; it goes to the second node instead.
    pool = Pool.from_dict(
        {"nodes": [B200_NODE, {"name": "b200-1", "gpu": "B200-180GB", "count": 1}]}
    )
    core = SchedulerCore(pool.state(), get_policy("firstfit"))
    core.submit(_req("hog", cpus=100))
    [d] = core.tick(0.0)
    assert d.chosen_option is not None and d.chosen_option.node == "b200-0"
    core.submit(_req("d1"))
    core.submit(_req("d2"))
    got = {d.job_id: d for d in core.tick(1.0)}
    assert got["d1"].state == "placed" and got["d1"].chosen_option is not None
    assert got["d1"].chosen_option.node == "b200-1"
    assert got["d2"].state == "pending"
    # b200-1's one GPU is taken; b200-0 has idle GPUs but 12 cores.
    assert got["d2"].reason == "waiting: B200-180GB: needs 14 CPUs, 12 free on b200-0"
    core.state.assert_consistent()


def test_every_policy_keeps_within_the_nodes_cpus() -> None:
    pool = Pool.from_dict(
        {"nodes": [{**B200_NODE, "count": 4}, {"name": "h", "gpu": "H100-80GB", "count": 4}]}
    )
    reqs = [_req(f"j{i}", 30.0, cpus=20) for i in range(8)]
    for policy in (
        "rightsize",
        "firstfit",
        "bestfit",
        "fgd",
        "requested",
        "optimal",
        "easy_backfill",
    ):
        core = SchedulerCore(pool.state(), get_policy(policy))
        for r in reqs:
            core.submit(r)
        placed = [d for d in core.tick(0.0) if d.state == "placed"]
        core.state.assert_consistent()
        # 56 cores per 4-GPU node: two 20-core jobs each, whatever the GPUs say (`requested`
        # and `easy_backfill` ask for H100s only, the habit).
        want = [0, 40_000] if policy in ("requested", "easy_backfill") else [40_000, 40_000]
        assert len(placed) == sum(want) // 20_000, policy
        assert core.state.node_cpu_milli.tolist() == want, policy


def test_state_refuses_an_option_whose_cpus_are_taken_and_changes_nothing() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    state = pool.state()
    first = enumerate_options(_req("a", cpus=100), state)[0]
    state.allocate(first, "a")
    before = (state.node_cpu_milli.tobytes(), state.used_mib.tobytes(), state.busy.tobytes())
    second = replace(first, gpu_indices=(1,), cpus=14.0)  # GPU 1 is idle, the cores are not
    with pytest.raises(PlacementError, match=r"needs 14 CPUs, 12 free on b200-0"):
        state.allocate(second, "b")
    assert (
        state.node_cpu_milli.tobytes(),
        state.used_mib.tobytes(),
        state.busy.tobytes(),
    ) == before
    state.release("a")
    assert not state.node_cpu_milli.any() and not state.node_host_mib.any()
    assert not state.node_over.any()


def test_release_restores_every_array_and_rebuild_from_allocations_agrees() -> None:
    pool = Pool.from_dict(
        {
            "nodes": [
                B200_NODE,
                {"name": "m", "gpu": "H100-80GB", "count": 2, "mode": "mig", "mig": "dynamic"},
            ]
        }
    )
    core = SchedulerCore(pool.state(), get_policy("rightsize"))
    for i, kw in enumerate([{}, {"cpus": 50}, {"host_memory_gib": 700.0}, {"cpus": 0.5}]):
        core.submit(_req(f"j{i}", 9.0, **kw))  # type: ignore[arg-type]
    core.tick(0.0)
    state = core.state
    assert len(state) == 4
    rebuilt = PoolState.from_allocations(pool, state.allocations())
    assert rebuilt.node_cpu_milli.tolist() == state.node_cpu_milli.tolist()
    assert rebuilt.node_host_mib.tolist() == state.node_host_mib.tolist()
    assert rebuilt.node_over.tolist() == state.node_over.tolist()
    for j in list(state.jobs):
        state.release(j)
    assert not state.node_cpu_milli.any() and not state.node_host_mib.any()
    assert not state.node_over.any()
    state.assert_consistent()


def test_fits_now_any_agrees_with_the_tables_when_cpus_bind() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE, {"name": "h", "gpu": "H100-80GB", "count": 2}]})
    state = pool.state()
    state.allocate(_bound(_req("hog", cpus=110), state, "B200-180GB x1"), "hog")
    reqs = [_req(f"q{i}", 20.0, cpus=c) for i, c in enumerate([1, 2, 3, 20, 28, 29, 14, 0.5] * 3)]
    batch = OptionBatch(reqs, pool)
    for i in range(len(reqs)):
        assert batch.fits_now_any(i, state) == bool(batch.table(i, state).fits_now.any()), i
    # 2 cores left on b200-0, 28 on the H100 node: what asks 29 fits nowhere now.
    assert not batch.fits_now_any(5, state) and batch.fits_now_any(4, state)


def test_option_records_round_trip_the_host_figures() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    opt = enumerate_options(_req("a", cpus=3.25, host_memory_gib=10.5), pool.state())[0]
    back = type(opt).from_dict(opt.to_dict())
    assert (back.cpus, back.host_memory_gib) == (3.25, 10.5)
    old = {k: v for k, v in opt.to_dict().items() if k not in ("cpus", "host_memory_gib")}
    assert type(opt).from_dict(old).cpus is None  # records from before: take no CPUs


@pytest.mark.parametrize("bad", [{"cpus": 0.0}, {"cpus": float("inf")}, {"host_memory_gib": -1.0}])
def test_request_refuses_bad_host_figures(bad: dict[str, float]) -> None:
    with pytest.raises(PlacementError, match=next(iter(bad))):
        _req("x", **bad)  # type: ignore[arg-type]


def test_rejected_or_pending_cpu_reason_is_stable_under_many_queued_jobs() -> None:
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    reqs = [_req("hog", cpus=100)] + [_req(f"w{i}", cpus=13) for i in range(50)]
    got = _tick(pool, *reqs, policy="firstfit")
    assert got["hog"].state == "placed"
    waiting = [d for d in got.values() if d.state == "pending"]
    assert len(waiting) == 50
    assert {d.reason for d in waiting} == {"waiting: B200-180GB: needs 13 CPUs, 12 free on b200-0"}
    assert np.isclose(got["hog"].chosen_option.cpus or 0, 100)  # type: ignore[union-attr]


def test_backfill_keeps_the_reserved_jobs_cpus_on_its_node() -> None:
    # R (50 cores) runs until t=3600; H needs 100 of the 112 cores, so it reserves the start
    # R's end gives it, holding the 50 cores R's end does not free. A long job asking 20
    # would take them and delay H; one asking 10 leaves enough, and a short one ends first.
    pool = Pool.from_dict({"nodes": [B200_NODE]})
    # Plain backfill in queue order (no look-ahead repack of the head).
    core = SchedulerCore(pool.state(), get_policy("rightsize", lookahead=0))

    def req(jid: str, cpus: float, runtime: float, t: float) -> PlacementRequest:
        return PlacementRequest(
            jid, [18.0] * 5, [20.0] * 5, [runtime] * 5, [runtime] * 5, cpus=cpus, submit_time_s=t
        )

    core.submit(req("R", 50, 3600.0, 0.0))
    [r] = core.tick(0.0)
    assert r.state == "placed"
    for jid, cpus, runtime, t in (("H", 100, 3600, 1), ("C", 20, 7200, 2), ("D", 10, 7200, 3)):
        core.submit(req(jid, cpus, runtime, t))
    core.submit(req("E", 20, 600.0, 4.0))
    got = {d.job_id: d for d in core.tick(1.0)}
    assert got["H"].state == "pending" and "reserved B200-180GB x1 on b200-0" in got["H"].reason
    assert got["C"].state == "pending" and "would delay H" in got["C"].reason
    assert got["D"].state == "placed" and got["E"].state == "placed"
    core.state.assert_consistent()
