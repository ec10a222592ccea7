"""Pool files, MIG placement rules, and PoolState bookkeeping (allocate/release inverse)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predictor.gpus import GPU_NAMES
from scheduler.core.decision import Option
from scheduler.core.mig import mig_mask
from scheduler.core.options import enumerate_options
from scheduler.core.pool import Pool, load_pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.state import PoolState
from scheduler.core.synthetic import synthetic_pool
from scheduler.exceptions import PlacementError, PoolError
from tests.placement import flat_request, node, pool_of

REPO = Path(__file__).resolve().parents[3]
POOLS = REPO / "datasets" / "pools"


def _req(job_id: str, upper: float, n: int = 1, runtime: float = 3600.0) -> PlacementRequest:
    return flat_request(job_id, upper, n, runtime=runtime)


def _snapshot(s: PoolState) -> tuple[bytes, ...]:
    return (
        s.used_mib.tobytes(),
        s.reserved_mib.tobytes(),
        s.busy.tobytes(),
        s.mig_occ.tobytes(),
        s.shared_count.tobytes(),
    )


def test_shipped_pools_load_with_every_type_and_modes() -> None:
    mixed = load_pool(POOLS / "mixed.toml")
    assert mixed.n_gpus == 32
    assert set(mixed.types_present()) == set(GPU_NAMES)
    modes = {n.mode for n in mixed.nodes}
    assert modes == {"whole", "mig", "shared"}
    small = load_pool(POOLS / "small.toml")
    assert small.n_gpus <= 16
    assert any(n.mig_layout is not None for n in small.nodes)


def test_unknown_gpu_type_names_node_and_choices() -> None:
    with pytest.raises(PoolError, match=r"node 'n3': unknown GPU type 'H100'; use one of"):
        Pool.from_dict({"nodes": [{"name": "n3", "gpu": "H100", "count": 2}]})


def test_bad_fields_are_reported_with_node_name() -> None:
    with pytest.raises(PoolError, match="node 'x' field count"):
        Pool.from_dict({"nodes": [{"name": "x", "gpu": "H100-80GB", "count": 0}]})
    with pytest.raises(PoolError, match="appears twice"):
        pool_of(node("a", "H100-80GB"), node("a", "H100-80GB"))


def test_price_overrides_apply_and_unknown_price_type_fails() -> None:
    pool = pool_of(node("a", "H100-80GB", 1), prices={"H100-80GB": 2.5})
    assert pool.price_for("H100-80GB") == 2.5
    with pytest.raises(PoolError, match="unknown GPU type"):
        Pool.from_dict({"prices": {"X": 1.0}, "nodes": [{"name": "a", "gpu": "H100-80GB"}]})


def test_static_mig_layout_follows_placement_rules() -> None:
    ok = pool_of(node("m", "A100-80GB", 1, mode="mig", mig=[["1g.10gb", "4g.40gb", "2g.20gb"]]))
    layout = ok.nodes[0].mig_layout
    assert layout is not None
    starts = dict(layout[0])
    # 4g must take slot 0; the rest fit after it.
    assert starts["4g.40gb"] == 0
    # Two 4g instances cannot share one GPU (compute slices overlap).
    with pytest.raises(PoolError, match="does not fit one A100-80GB"):
        pool_of(node("m", "A100-80GB", 1, mode="mig", mig=[["4g.40gb", "4g.40gb"]]))
    with pytest.raises(PoolError, match="cannot start at slot 1"):
        pool_of(node("m", "H100-80GB", mode="mig", mig=["3g.40gb@1"]))
    with pytest.raises(PoolError, match="unknown MIG profile"):
        Pool.from_dict({"nodes": [{"name": "m", "gpu": "H100-80GB", "mode": "mig", "mig": ["9g"]}]})
    with pytest.raises(PoolError, match="needs a layout"):
        Pool.from_dict({"nodes": [{"name": "m", "gpu": "H100-80GB", "mode": "mig"}]})


def test_mig_masks_forbid_overlaps_and_allow_valid_mixes() -> None:
    gpu = load_pool(POOLS / "mixed.toml").catalogue["A100-80GB"]
    p = {x.name: x for x in gpu.mig_profiles}
    assert mig_mask(p["4g.40gb"], 0) & mig_mask(p["3g.40gb"], 4) == 0
    assert mig_mask(p["3g.40gb"], 0) & mig_mask(p["3g.40gb"], 4) == 0
    assert mig_mask(p["4g.40gb"], 0) & mig_mask(p["1g.10gb"], 3) != 0
    assert mig_mask(p["7g.80gb"], 0) & mig_mask(p["1g.10gb"], 6) != 0


def test_dynamic_mig_repartitions_on_demand() -> None:
    pool = pool_of(node("m", "A100-80GB", 1, mode="mig", mig="dynamic"))
    state = pool.state()
    # Seven 1g.10gb jobs fill the GPU; an eighth has nowhere to go.
    for k in range(7):
        opts = enumerate_options(_req(f"j{k}", 9.0), state)
        o = next(o for o in opts if o.mig_profile == "1g.10gb")
        assert o.fits_now
        state.allocate(o, f"j{k}")
    opts = enumerate_options(_req("j7", 9.0), state)
    assert not any(o.fits_now for o in opts)
    state.assert_consistent()
    # Free the 1g at slots 0..3, and a 4g.40gb fits where they were.
    for job in list(state.jobs):
        if state.option_of(job).mig_start in (0, 1, 2, 3):
            state.release(job)
    opts = enumerate_options(_req("big", 35.0), state)
    four = next(o for o in opts if o.mig_profile == "4g.40gb")
    assert four.fits_now and four.mig_start == 0


def test_shared_gpu_cap_and_memory_limit() -> None:
    pool = pool_of(node("s", "H100-80GB", 1, mode="shared", max_shared_jobs=2))
    state = pool.state()
    for k in range(2):
        o = next(o for o in enumerate_options(_req(f"j{k}", 10.0), state) if o.kind == "shared")
        state.allocate(o, f"j{k}")
    o = next(o for o in enumerate_options(_req("j2", 10.0), state) if o.kind == "shared")
    assert not o.fits_now
    assert "max_shared_jobs" in o.reason
    with pytest.raises(PlacementError, match="max_shared_jobs"):
        state.allocate(
            Option(
                "shared",
                "H100-80GB",
                "s",
                (0,),
                None,
                1,
                79.65,
                1.0,
                1.0,
                1.0,
                1.0,
                1.0,
                True,
                True,
            ),
            "j3",
        )
    state.assert_consistent()


def test_allocate_refuses_busy_gpus_without_changing_state() -> None:
    pool = Pool.from_dict({"nodes": [{"name": "w", "gpu": "H100-80GB", "count": 2}]})
    state = pool.state()
    o = next(o for o in enumerate_options(_req("a", 20.0, n=2), state) if o.kind == "whole")
    state.allocate(o, "a")
    before = _snapshot(state)
    with pytest.raises(PlacementError, match="not all idle"):
        state.allocate(o, "b")
    with pytest.raises(PlacementError, match="already holds"):
        state.allocate(o, "a")
    assert _snapshot(state) == before
    with pytest.raises(PlacementError, match="holds nothing"):
        state.release("nope")


def test_free_by_type_and_copy_independence() -> None:
    pool = load_pool(POOLS / "mixed.toml")
    state = pool.state()
    free = state.free_by_type()
    assert free["H100-80GB"].gpus == 10
    assert free["H100-80GB"].idle_gpus == 10
    copy = state.copy()
    o = next(o for o in enumerate_options(_req("a", 20.0), copy) if o.gpu_type == "H100-80GB")
    copy.allocate(o, "a")
    assert "a" in copy and "a" not in state
    assert state.free_by_type()["H100-80GB"].idle_gpus == 10


def test_adopt_keeps_the_summary_equal_to_a_recount() -> None:
    """adopt() takes over the copy's incremental summary with the nodes it touched: a summary
    taken over without them kept stale idle counts (a whole-GPU option read as free)."""
    pool = load_pool(POOLS / "mixed.toml")
    state = pool.state()
    state.summary()  # counted once, so the next one is incremental
    trial = state.copy()
    for k in range(6):
        o = next(o for o in enumerate_options(_req(f"j{k}", 20.0, n=2), trial) if o.fits_now)
        trial.allocate(o, f"j{k}")
    trial.summary()  # the trial counts its touched nodes, then allocates once more
    o = next(o for o in enumerate_options(_req("last", 20.0, n=2), trial) if o.fits_now)
    trial.allocate(o, "last")
    state.adopt(trial)
    fresh = state.copy()
    fresh._summary, fresh._touched = None, None  # a full recount from the arrays
    got, want = state.summary(), fresh.summary()
    for f in ("node_free", "type_max_node_free", "class_supply", "class_avail"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f


def test_incremental_summary_equals_a_recount_across_kinds() -> None:
    """The shared and MIG parts recount only the nodes touched since the last summary (the
    whole part those since its own last count): after every allocation and release of any
    kind, every figure equals a full recount from the arrays."""
    pool = synthetic_pool(256, seed=1)
    state = pool.state()
    state.summary()
    placed: list[str] = []
    for k in range(120):
        if k % 9 == 8 and placed:
            state.release(placed.pop(k % len(placed)))
        else:
            opts = [o for o in enumerate_options(_req(f"j{k}", 8.0 + (k % 5) * 7), state)]
            fits = [o for o in opts if o.fits_now]
            if not fits:
                continue
            o = fits[k % len(fits)]  # every kind in turn, not only the cheapest
            state.allocate(o, f"j{k}")
            placed.append(f"j{k}")
        if k % 3:
            continue  # several changes between two summaries, too
        fresh = state.copy()
        fresh._summary, fresh._touched, fresh._since = None, None, None
        got, want = state.summary(), fresh.summary()
        for f in (
            "node_free",
            "type_max_node_free",
            "type_shared_free_mib",
            "class_avail",
            "mig_avail",
            "class_supply",
            "shared_node_free_mib",
        ):
            a, b = getattr(got, f), getattr(want, f)
            if f == "node_free":  # only whole-serving nodes' idle counts are ever read
                a, b = a[pool.node_whole], b[pool.node_whole]
            assert np.array_equal(a, b), (k, f)


def test_synthetic_pool_is_seeded_and_sized() -> None:
    a = synthetic_pool(1024, seed=3)
    b = synthetic_pool(1024, seed=3)
    c = synthetic_pool(1024, seed=4)
    assert a.n_gpus == 1024 and len(a.nodes) == 128
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() != c.to_dict()
    with pytest.raises(PoolError, match="multiple of 8"):
        synthetic_pool(12)


def test_pool_round_trips_through_dict() -> None:
    pool = load_pool(POOLS / "small.toml")
    again = Pool.from_dict(pool.to_dict())
    assert again.to_dict() == pool.to_dict()
    assert again.nodes == pool.nodes


def test_missing_pool_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(PoolError, match="does not exist"):
        load_pool(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("nodes = [", encoding="utf-8")
    with pytest.raises(PoolError, match="not valid TOML"):
        load_pool(bad)


@settings(max_examples=40, deadline=None)
@given(
    uppers=st.lists(st.floats(1.0, 170.0), min_size=1, max_size=25),
    ns=st.lists(st.sampled_from([1, 1, 1, 2, 4]), min_size=25, max_size=25),
    order=st.randoms(use_true_random=False),
)
def test_allocate_release_is_an_exact_inverse(
    uppers: list[float], ns: list[int], order: object
) -> None:
    pool = load_pool(POOLS / "mixed.toml")
    state = pool.state()
    empty = _snapshot(state)
    placed: list[str] = []
    for k, upper in enumerate(uppers):
        jid = f"j{k}"
        opts = [o for o in enumerate_options(_req(jid, upper, ns[k]), state) if o.fits_now]
        if not opts:
            continue
        o = opts[k % len(opts)]
        before = _snapshot(state)
        state.allocate(o, jid)
        state.assert_consistent()
        assert o.reserved_gib >= upper
        # Undo and redo: the state returns bit for bit.
        state.release(jid)
        assert _snapshot(state) == before
        state.allocate(o, jid)
        placed.append(jid)
    order.shuffle(placed)  # type: ignore[attr-defined]
    for jid in placed:
        state.release(jid)
        state.assert_consistent()
    assert _snapshot(state) == empty
    assert np.all(state.free_mib == pool.capacity_mib)


def test_release_many_leaves_the_state_of_one_by_one_releases() -> None:
    """Backfill's search releases thousands of jobs from copies of a state at once: every
    array, the version, the summary's bookkeeping and the allocations come out as releasing
    them one by one, in order, leaves them."""
    from scheduler.core._release import release_many

    pool = synthetic_pool(256, seed=4)  # whole, MIG and shared GPUs
    state = pool.state()
    state.summary()
    jobs: list[str] = []
    for k in range(150):
        opts = [o for o in enumerate_options(_req(f"j{k}", 5.0 + (k % 7) * 11, 1 + k % 3), state)]
        fits = [o for o in opts if o.fits_now]
        if fits:
            state.allocate(fits[k % len(fits)], f"j{k}")
            jobs.append(f"j{k}")
    state.summary()
    assert {state._allocs[j].kind for j in jobs} == {0, 1, 2}
    for some in (jobs[::3], jobs[5:60], jobs, []):
        a, b = state.copy(), state.copy()
        for j in some:
            a.release(j)
        release_many(b, some)
        assert _snapshot(a) == _snapshot(b)
        for name in ("node_cpu_milli", "node_host_mib", "node_over"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert list(a._allocs) == list(b._allocs) and a.version == b.version
        assert (a._dirty, a._touched, a._since, a._over_changed) == (
            b._dirty,
            b._touched,
            b._since,
            b._over_changed,
        )
        sa, sb = a.summary(), b.summary()
        for f in ("node_free", "class_supply", "mig_avail", "type_shared_free_mib"):
            assert np.array_equal(getattr(sa, f), getattr(sb, f)), f
    with pytest.raises(PlacementError, match="holds nothing"):
        release_many(state.copy(), [jobs[0], "nobody"])
