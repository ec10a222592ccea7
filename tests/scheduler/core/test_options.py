"""Option enumeration (core.options, core.table): sizing by the upper bound, prices, gangs,
MIG/shared rules, reasons."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from predictor.gpus import get_gpu
from scheduler.core.decide import cheapest_index
from scheduler.core.decision import Option
from scheduler.core.options import OptionBatch, enumerate_options, fits_anywhere
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.shares import shared_compute_share
from scheduler.core.table import OptionTable
from tests.placement import flat_request, node, pool_of

MIXED = {
    "prices": {"H100-80GB": 3.0},
    "nodes": [
        {"name": "a40", "gpu": "A100-40GB", "count": 4},
        {"name": "a80", "gpu": "A100-80GB", "count": 2, "mode": "mig", "mig": "dynamic"},
        {"name": "h100", "gpu": "H100-80GB", "count": 4},
        {"name": "h100s", "gpu": "H100-80GB", "count": 1, "mode": "shared"},
        {"name": "b200", "gpu": "B200-180GB", "count": 2},
    ],
}


def _req(
    upper: float | list[float], n: int = 1, runtime: float = 3600.0, **kw: object
) -> PlacementRequest:
    return flat_request(str(kw.pop("job_id", "j")), upper, n, runtime=runtime, **kw)


def _by_label(opts: list[Option]) -> dict[str, Option]:
    return {o.label: o for o in opts}


def test_every_option_reserves_at_least_the_upper_bound() -> None:
    state = Pool.from_dict(MIXED).state()
    for o in enumerate_options(_req(12.34), state):
        assert o.reserved_gib >= 12.34
        assert o.reserved_gib - 12.34 < 1 / 1024 + 1e-9
    # An OOM override raises the reservation, never lowers it.
    opts = enumerate_options(_req(12.34, reserved_gib=20.0), state)
    assert all(o.reserved_gib == 20.0 for o in opts)
    opts = enumerate_options(_req(12.34, reserved_gib=5.0), state)
    assert all(o.reserved_gib >= 12.34 for o in opts)


def test_prices_follow_the_documented_rules() -> None:
    pool = Pool.from_dict(MIXED)
    opts = _by_label(enumerate_options(_req(8.0, runtime=7200.0), pool.state()))
    h100 = opts["H100-80GB x1"]
    assert h100.cost_usd == pytest.approx(3.0 * 2.0)  # pool override, 2 hours
    # A MIG slice is billed compute_slices/7 and runs 7/compute_slices longer.
    mig = opts["A100-80GB MIG 1g.10gb"]
    assert mig.runtime_s == pytest.approx(7200.0 * 7)
    assert mig.cost_usd == pytest.approx(get_gpu("A100-80GB").price_usd_per_hour * 1 / 7 * 14)
    # A shared GPU is billed the reservation's share of its memory; its compute share (MPS
    # active threads) is that share, at least 1 / max_shared_jobs (4 here): a saturating job
    # runs 1 / compute share longer.
    shared = opts["H100-80GB shared"]
    share = shared.reserved_gib / shared.capacity_gib
    compute = max(share, 1 / 4)
    assert shared_compute_share(shared.reserved_gib, shared.capacity_gib, 4) == compute
    assert shared.runtime_s == pytest.approx(7200.0 / compute, rel=1e-3)
    assert shared.cost_usd == pytest.approx(3.0 * share * 2.0 / compute, rel=1e-3)
    # Multi-GPU whole options pay per GPU.
    two = _by_label(enumerate_options(_req(8.0, n=2, runtime=3600.0), pool.state()))
    assert two["H100-80GB x2"].cost_usd == pytest.approx(6.0)


def test_only_the_saturating_share_of_a_job_stretches_on_a_mig_slice() -> None:
    pool = Pool.from_dict(MIXED)
    price = get_gpu("A100-80GB").price_usd_per_hour
    # A launch-bound job (10% busy) barely slows on a 1g slice and pays a seventh.
    light = _by_label(
        enumerate_options(_req(8.0, runtime=7200.0, busy_frac=[0.1] * 5), pool.state())
    )
    slice_1g = light["A100-80GB MIG 1g.10gb"]
    assert slice_1g.runtime_s == pytest.approx(7200.0 * (1 + 0.1 * 6))
    assert slice_1g.cost_usd == pytest.approx(price / 7 * 2.0 * 1.6)
    assert slice_1g.cost_usd < price * 2.0 / 4  # the whole A100-80GB: price x 2 h
    # Whole GPUs are unaffected by the busy fraction; on a shared GPU only the busy part
    # stretches by 1 / compute share.
    assert light["H100-80GB x1"].runtime_s == pytest.approx(7200.0)
    sh = light["H100-80GB shared"]
    compute = shared_compute_share(sh.reserved_gib, sh.capacity_gib, 4)
    assert sh.runtime_s == pytest.approx(7200.0 * (1 + 0.1 * (1 / compute - 1)), rel=1e-3)
    # Unknown or non-finite busy fractions count as saturating: the old, safe rule.
    unknown = _req(8.0, runtime=7200.0, busy_frac=[float("nan")] * 5)
    assert np.all(unknown.busy_frac == 1.0)
    full = _by_label(enumerate_options(unknown, pool.state()))
    assert full["A100-80GB MIG 1g.10gb"].runtime_s == pytest.approx(7200.0 * 7)


def test_kueue_style_reasons() -> None:
    pool = Pool.from_dict(MIXED)
    state = pool.state()
    opts = _by_label(enumerate_options(_req(47.1), state))
    assert opts["A100-40GB x1"].reason == "A100-40GB: needs 47.1 GiB > 40.0 GiB"
    assert opts["A100-80GB MIG 1g.10gb"].reason == (
        "A100-80GB MIG 1g.10gb: needs 47.1 GiB > 10.0 GiB"
    )
    # Fill three of four H100s, then ask for two.
    o = _by_label(enumerate_options(_req(10.0, n=3), state))["H100-80GB x3"]
    state.allocate(o, "filler")
    opts = _by_label(enumerate_options(_req(10.0, n=2), state))
    assert opts["H100-80GB x2"].reason == "insufficient free H100-80GB: 1 more needed"
    assert opts["A100-80GB MIG 1g.10gb"].reason.endswith("takes 1-GPU jobs only (job needs 2)")
    pinned = _by_label(enumerate_options(_req(10.0, gpu="B200-180GB"), state))
    assert pinned["A100-40GB x1"].reason == "pinned to B200-180GB"
    assert pinned["B200-180GB x1"].fits_now


def test_gang_stays_in_one_node_when_one_node_holds_it() -> None:
    pool = pool_of(node("h1", "H100-80GB", 4), node("h2", "H100-80GB", 4))
    state = pool.state()
    o = _by_label(enumerate_options(_req(10.0, n=4), state))["H100-80GB x4"]
    assert len(set(o.gpu_indices)) == 4
    assert {pool.nodes[int(pool.gpu_node[g])].name for g in o.gpu_indices} == {o.node}
    # Larger than any node: a multi-node gang over both (scheduler.core.gang, tests/test_gang).
    big = _by_label(enumerate_options(_req(10.0, n=8), state))["H100-80GB x8 (2 nodes)"]
    assert big.fits_now and big.n_nodes == 2
    # Two GPUs busy on each node: a 3-GPU gang must wait even though 4 are free overall.
    two = _by_label(enumerate_options(_req(10.0, n=2), state))["H100-80GB x2"]
    state.allocate(replace(two, gpu_indices=(0, 1), node="h1"), "a")
    state.allocate(replace(two, gpu_indices=(4, 5), node="h2"), "b")
    three = _by_label(enumerate_options(_req(10.0, n=3), state))["H100-80GB x3"]
    assert three.fits_empty and not three.fits_now


def test_pack_prefers_the_fullest_node() -> None:
    pool = pool_of(node("h1", "H100-80GB", 4), node("h2", "H100-80GB", 4))
    state = pool.state()
    first = _by_label(enumerate_options(_req(10.0, n=1), state))["H100-80GB x1"]
    state.allocate(first, "a")
    again = _by_label(enumerate_options(_req(10.0, n=1), state))["H100-80GB x1"]
    assert again.node == first.node
    first_fit = _by_label(enumerate_options(_req(10.0, n=4), state, select="first"))
    assert first_fit["H100-80GB x4"].node == "h2"


def test_cheapest_is_the_smallest_slot_on_ties() -> None:
    pool = Pool.from_dict(MIXED)
    opts = enumerate_options(_req(8.0), pool.state())
    i = cheapest_index(opts)
    assert i is not None
    # The shared H100 is billed by memory share (a tenth) and promises a quarter of the SMs
    # (max_shared_jobs = 4): even a saturating job pays 0.1 / 0.25 of the whole GPU there.
    assert opts[i].label == "H100-80GB shared"
    # Every MIG slice of an A100-80GB costs what the whole GPU would; the smallest that fits
    # wins the tie.
    a80 = [o for o in opts if o.gpu_type == "A100-80GB"]
    j = cheapest_index(a80)
    assert j is not None and a80[j].label == "A100-80GB MIG 1g.10gb"


def test_restrictions_and_reserve_whole() -> None:
    pool = Pool.from_dict(MIXED)
    opts = enumerate_options(
        _req(8.0),
        pool.state(),
        types=("H100-80GB",),
        kinds=("whole",),
        reserve_whole=True,
        why_excluded="not requested",
    )
    fits = [o for o in opts if o.fits_now]
    assert [o.label for o in fits] == ["H100-80GB x1"]
    assert fits[0].reserved_gib == fits[0].capacity_gib
    assert {o.reason for o in opts if not o.fits_empty} == {"not requested"}


def test_unpredicted_types_are_infeasible_not_crashes() -> None:
    ups = [math.inf, 10.0, 10.0, math.nan, 10.0]
    opts = _by_label(enumerate_options(_req(ups), Pool.from_dict(MIXED).state()))
    assert not opts["A100-40GB x1"].fits_empty
    assert opts["A100-40GB x1"].reason == "A100-40GB: no prediction for this GPU type"
    assert opts["A100-40GB x1"].cost_usd is None
    assert opts["H100-80GB x1"].fits_now


def test_fits_anywhere_and_rejection_inputs() -> None:
    pool = Pool.from_dict(MIXED)
    assert fits_anywhere(_req(170.0), pool)
    assert not fits_anywhere(_req(500.0), pool)
    assert not fits_anywhere(_req(10.0, n=16), pool)


def test_batch_rows_match_single_tables() -> None:
    pool = Pool.from_dict(MIXED)
    state = pool.state()
    reqs = [_req(u, n=n, job_id=f"j{k}") for k, (u, n) in enumerate([(5, 1), (60, 2), (150, 1)])]
    batch = OptionBatch(reqs, pool)
    for i, r in enumerate(reqs):
        a = batch.table(i, state)
        b = OptionTable(r, state)
        for name in ("fits_now", "fits_empty", "cost", "need_mib", "runtime"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert a.cheapest_empty == b.cheapest_empty


def test_batch_row_slices_equal_the_batch_of_those_jobs() -> None:
    # A replay builds one batch for every job and hands the core one slice per tick: each
    # slice must be what a batch of just those jobs would be (own CPUs asked included).
    pool = Pool.from_dict(MIXED)
    state = pool.state()
    shapes = [(5.0, 1, None), (60.0, 2, None), (150.0, 1, 100.0), (10.0, 1, 3.0), (500.0, 1, None)]
    reqs = [_req(u, n=n, job_id=f"j{k}", cpus=c) for k, (u, n, c) in enumerate(shapes)]
    full = OptionBatch(reqs, pool)
    for lo, hi in [(0, 1), (2, 3), (1, 4), (4, 5), (0, 5)]:
        part, own = full.rows(lo, hi), OptionBatch(reqs[lo:hi], pool)
        assert len(part) == hi - lo and list(part.requests) == reqs[lo:hi]
        for i in range(hi - lo):
            assert part.fits_empty_any(i) == own.fits_empty_any(i)
            assert part.fits_now_any(i, state) == own.fits_now_any(i, state)
            a, b = part.table(i, state), own.table(i, state)
            for name in ("fits_now", "fits_empty", "cost", "need_mib", "host_exact", "gang"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
            assert a.cheapest_empty == b.cheapest_empty


def test_runner_up_is_the_best_of_the_rest() -> None:
    """OptionTable.runner_up reads the winner's ranking instead of sorting again: the same
    class as ranking every class that fits now but the winner, for every winner and keys."""
    from scheduler.core.synthetic import synthetic_pool

    pool = synthetic_pool(256, seed=2)
    state = pool.state()
    reqs = [flat_request(f"j{k}", 6.0 + 9 * (k % 9), 1 + (k % 3)) for k in range(90)]
    batch = OptionBatch(reqs, pool)
    checked = 0
    for i in range(len(reqs)):
        table = batch.table(i, state)
        by_cost = OptionTable.cost_keys
        for keys in (by_cost, lambda t: (t.cost,), lambda t: (-t.size_mib(), t.cost)):
            for chosen in [table.best_by(keys), *np.flatnonzero(table.fits_now)]:
                if chosen is None:
                    continue
                others = table.fits_now.copy()
                others[chosen] = False
                want = OptionTable.best(table, keys(table), others)
                table.best_by(keys)  # the ranking runner_up reads
                assert table.runner_up(keys, int(chosen)) == want
                checked += 1
        c = table.best(table.cost_keys(), table.fits_now)
        if c is not None and i % 2:
            state.allocate(table.option(c, table.bind(c, state)), reqs[i].job_id)
    assert checked > 200
