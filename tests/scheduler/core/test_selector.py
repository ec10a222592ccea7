"""Node labels and node selectors (core.selector and its use in options, table, binding and
the policies): pool-file labels, the canonical selector, jobs landing only on matching nodes,
and refusals that name the selector."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.decision import Decision
from scheduler.core.loop import SchedulerCore
from scheduler.core.options import OptionBatch, fits_anywhere
from scheduler.core.pool import Pool
from scheduler.core.requests import PlacementRequest
from scheduler.core.selector import node_selector, selector_nodes, selector_text
from scheduler.core.state import PoolState
from scheduler.exceptions import PlacementError, PoolError
from scheduler.policies.registry import get_policy
from tests.placement import flat_request, node, pool_of

POLICIES = ["rightsize", "firstfit", "bestfit", "fgd", "fgd_node", "bestfit_node", "lookahead"]


def _pool() -> Pool:
    """Two 8-GPU H100 nodes in zones a and b, one unlabelled, and a shared A100 node in zone a."""
    return pool_of(
        node("h0", "H100-80GB", 8, labels={"zone": "a", "gpu-model": "H100SXM"}),
        node("h1", "H100-80GB", 8, labels={"zone": "b", "gpu-model": "H100SXM"}),
        node("h2", "H100-80GB", 8),
        node("l0", "A100-40GB", 4, mode="shared", labels={"zone": "a"}),
    )


def _req(job_id: str, upper: float = 20.0, n: int = 1, **kw: object) -> PlacementRequest:
    return flat_request(job_id, upper, n, runtime_upper=4000.0, **kw)


def _tick(state: PoolState, policy: str, *reqs: PlacementRequest) -> dict[str, Decision]:
    core = SchedulerCore(state, get_policy(policy))
    for r in reqs:
        core.submit(r)
    return {d.job_id: d for d in core.tick(0.0)}


# -- pool labels ---------------------------------------------------------------------------------


def test_pool_nodes_carry_labels_and_read_back_equal() -> None:
    pool = _pool()
    assert dict(pool.nodes[0].labels) == {"gpu-model": "H100SXM", "zone": "a"}
    assert pool.nodes[2].labels == ()
    d = pool.to_dict()
    assert d["nodes"][0]["labels"] == {"gpu-model": "H100SXM", "zone": "a"}
    assert "labels" not in d["nodes"][2], "an unlabelled node keeps its pool-file form"
    assert Pool.from_dict(d).nodes == pool.nodes


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({"zone name": "a"}, "label key 'zone name' is not a label key"),
        ({"zone": "a b"}, "label 'zone': value 'a b' is not a label value"),
        ({"zone": ""}, "label 'zone': value '' is not a label value"),
        ({"zone": 3}, "Input should be a valid string"),
    ],
)
def test_bad_labels_are_refused_naming_node_field_and_value(labels: dict, words: str) -> None:
    with pytest.raises(PoolError) as exc:
        pool_of(node("h0", "H100-80GB", 8, labels=labels))
    msg = str(exc.value)
    assert "node 'h0' field labels" in msg and words in msg


# -- the selector --------------------------------------------------------------------------------


def test_selector_is_kept_in_canonical_form() -> None:
    r = _req("j", node_selector={"zone": ["b", "a", "a"], "gpu-model": "H100SXM"})
    assert r.node_selector == (("gpu-model", ("H100SXM",)), ("zone", ("a", "b")))
    assert selector_text(r.node_selector) == "gpu-model in {H100SXM}, zone in {a,b}"
    assert _req("k", node_selector={}).node_selector is None
    # dataclasses.replace passes the canonical form back in.
    assert r.with_reservation(30.0).node_selector == r.node_selector


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (["zone"], "node_selector must be a mapping"),
        ({"zone": []}, "needs at least one accepted value"),
        ({"bad key": "a"}, "label key 'bad key' is not a label key"),
        ({"zone": ["a", "b c"]}, "value 'b c' is not a label value"),
    ],
)
def test_bad_selectors_are_refused_naming_the_job(raw: object, words: str) -> None:
    with pytest.raises(PlacementError, match="job 'j': node_selector") as exc:
        _req("j", node_selector=raw)
    assert words in str(exc.value)


def test_node_mask_is_the_in_semantics_of_every_key() -> None:
    pool = _pool()
    mask = selector_nodes(pool, node_selector({"zone": ["a", "b"]}))
    assert mask.tolist() == [True, True, False, True]
    both = node_selector({"zone": "a", "gpu-model": ["H100SXM"]})
    assert selector_nodes(pool, both).tolist() == [True, False, False, False]
    # A node without the key never matches.
    assert not selector_nodes(pool, node_selector({"rack": "r1"})).any()


# -- placement -----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_selected_jobs_land_only_on_matching_nodes(policy: str) -> None:
    pool = _pool()
    state = pool.state()
    # Twelve 1-GPU jobs for zone b: its 8 GPUs take 8; zone a's H100 and the others stay free.
    reqs = [_req(f"b{i}", 60.0, node_selector={"zone": "b"}) for i in range(12)]
    ds = _tick(state, policy, *reqs)
    placed = [d for d in ds.values() if d.state == "placed"]
    assert len(placed) == 8, policy
    assert {d.chosen_option.node for d in placed} == {"h1"}, policy
    waiting = next(d for d in ds.values() if d.state != "placed")
    h100 = next(o for o in waiting.options if o.label == "H100-80GB x1")
    assert h100.reason == "H100-80GB: no node matching node_selector zone in {b} has room now"


def test_a_job_no_node_matches_loses_naming_the_selector() -> None:
    pool = _pool()
    r = _req("j", node_selector={"zone": ["c", "d"]})
    assert not fits_anywhere(r, pool)
    d = _tick(pool.state(), "rightsize", r)["j"]
    assert d.state == "rejected"
    assert {o.reason for o in d.options} == {"no node matches node_selector zone in {c,d}"}


def test_a_class_with_no_matching_node_says_so() -> None:
    pool = _pool()
    # Zone b has H100s but no shared A100: the shared class names the selector.
    d = _tick(pool.state(), "rightsize", _req("j", 10.0, node_selector={"zone": "b"}))["j"]
    assert d.state == "placed" and d.chosen_option.node == "h1"
    a100 = next(o for o in d.options if o.label == "A100-40GB shared")
    assert a100.reason == "shared A100-40GB: no node matches node_selector zone in {b}"


def test_whole_node_job_larger_than_any_matching_node_is_named() -> None:
    pool = pool_of(
        node("h0", "H100-80GB", 8),
        node("h1", "H100-80GB", 4, labels={"zone": "b"}),
    )
    d = _tick(pool.state(), "rightsize", _req("j", 60.0, n=8, node_selector={"zone": "b"}))["j"]
    assert d.state == "rejected"
    (o,) = d.options
    assert o.reason == (
        "H100-80GB: needs 8 GPUs in one node; the largest node matching node_selector "
        "zone in {b} has 4"
    )


def test_gang_spans_matching_nodes_only() -> None:
    pool = pool_of(
        *(node(f"h{i}", "H100-80GB", 8, labels={"zone": "a" if i < 2 else "b"}) for i in range(4))
    )
    state = pool.state()
    ds = _tick(state, "rightsize", _req("g", 60.0, n=16, node_selector={"zone": "b"}))
    opt = ds["g"].chosen_option
    assert ds["g"].state == "placed" and opt.n_nodes == 2
    nodes = {pool.nodes[int(pool.gpu_node[g])].name for g in opt.gpu_indices}
    assert nodes == {"h2", "h3"}
    # Zone b is now full and zone a's 16 idle GPUs are not the gang's to take.
    d = _tick(state, "rightsize", _req("g2", 60.0, n=16, node_selector={"zone": "b"}))["g2"]
    assert d.state == "pending"
    assert "needs 16 GPUs of H100-80GB across 2 nodes; only 0 nodes have 8 free" in d.reason


def test_batch_rows_keep_each_jobs_mask() -> None:
    pool = _pool()
    reqs = [
        _req("free"),
        _req("a", node_selector={"zone": "a"}),
        _req("b", node_selector={"zone": "b"}),
    ]
    batch = OptionBatch(reqs, pool)
    sub = batch.rows(1, 3)
    assert sub.node_ok[0] is batch.node_ok[1]
    assert np.array_equal(sub.node_ok[1], [False, True, False, False])
    state = pool.state()
    assert batch.table(0, state).node_ok is None
    # Only nodes of zone a host the A100 class for job "a"; job "b" has none there.
    a100 = next(c for c in range(pool.n_classes) if pool.class_label(c) == "shared A100-40GB")
    assert batch.sel_ok[:, a100].tolist() == [True, True, False]
