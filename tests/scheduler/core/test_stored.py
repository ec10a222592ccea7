"""A stored decision keeps repeating columns as runs and more reasons as codes; every reader
(``snugfit explain``, the dashboard, ``Client`` decision reads) sees what it saw before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from scheduler.cli.render import explain
from scheduler.core.decision import Decision, _columns
from scheduler.core.loop import SchedulerCore
from scheduler.core.pool import Pool
from scheduler.core.reasons import REASON_NO_FREE_SLICE, REASON_SHARED_FULL
from scheduler.core.stored import RUN_COLUMNS, expand_runs
from scheduler.dashboard.job_view import decision_rows
from scheduler.exceptions import SchedulerError
from scheduler.policies.registry import get_policy
from tests.placement import flat_request

# Whole A100s, a MIG-partitioned H100 and a shared H100 (two jobs at most), plus two 8-GPU
# H100 nodes on one rack for a multi-node gang.
_POOL = {
    "nodes": [
        {"name": "w", "gpu": "A100-80GB", "count": 4},
        {"name": "m", "gpu": "H100-80GB", "count": 1, "mode": "mig", "mig": "dynamic"},
        {"name": "s", "gpu": "H100-80GB", "count": 1, "mode": "shared", "max_shared_jobs": 2},
        {"name": "g1", "gpu": "H200-141GB", "count": 8, "rack": "r"},
        {"name": "g2", "gpu": "H200-141GB", "count": 8, "rack": "r"},
    ]
}


def _decide(*reqs: Any, core: SchedulerCore | None = None) -> dict[str, Decision]:
    core = core or SchedulerCore(Pool.from_dict(_POOL).state(), get_policy("rightsize"))
    for r in reqs:
        core.submit(r)
    return {d.job_id: d for d in core.tick(0.0)}


def _legacy(d: Decision) -> dict[str, Any]:
    """The record as the store held it before runs: every column a list, every reason in words
    (a reader always took words)."""
    out = json.loads(json.dumps(d.to_dict(compact=True)))
    out["option_columns"] = json.loads(json.dumps(_columns(d.options)))
    return out


def _text(d: Decision) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(explain({"id": d.job_id, "state": d.state, "reason": d.reason}, d))
    return console.export_text()


def _filled(n: int, **kw: Any) -> SchedulerCore:
    """A core whose pool already runs ``n`` 9 GiB jobs."""
    core = SchedulerCore(Pool.from_dict(_POOL).state(), get_policy("rightsize"))
    _decide(*(flat_request(f"f{i}", 9.0, **kw) for i in range(n)), core=core)
    return core


def _cases() -> dict[str, Decision]:
    placed = _decide(
        flat_request("whole", 60.0, 2),
        flat_request("shared", 8.0, gpu="H100-80GB"),  # the shared H100 is the cheapest
        flat_request("gang", 100.0, 16, tensor_parallel=8),
    )
    # With the shared H100 at its job limit and most slices taken, a small job gets a slice;
    # a larger one waits (its slices are taken or too small).
    mig = _decide(flat_request("mig", 9.0, gpu="H100-80GB"), core=_filled(12))
    waiting = _decide(
        flat_request("pending", 30.0, gpu="H100-80GB"), core=_filled(7, gpu="H100-80GB")
    )
    return {**placed, **mig, **waiting}


@pytest.fixture(scope="module")
def cases() -> dict[str, Decision]:
    return _cases()


def test_the_cases_cover_every_kind_of_placement(cases: dict[str, Decision]) -> None:
    kinds = {k: d.chosen_option.kind for k, d in cases.items() if d.chosen_option is not None}
    assert kinds == {"whole": "whole", "mig": "mig", "gang": "whole", "shared": "shared"}
    assert cases["gang"].chosen_option.n_nodes == 2  # type: ignore[union-attr]
    assert cases["pending"].state == "pending"


@pytest.mark.parametrize("name", ["whole", "mig", "shared", "gang", "pending"])
def test_every_reader_sees_what_it_saw_before(cases: dict[str, Decision], name: str) -> None:
    d = cases[name]
    stored = json.loads(json.dumps(d.to_dict(compact=True)))
    before = Decision.from_dict(_legacy(d))
    now = Decision.from_dict(stored)
    # Client.decision and `snugfit explain --json` (the full record), the explain table, the
    # dashboard's rows: the same as from the record the store held before, and as the decision.
    assert now.to_dict() == before.to_dict() == d.to_dict()
    assert _text(now) == _text(before) == _text(d)
    assert decision_rows(now) == decision_rows(before)
    # And smaller: the repeating columns are runs.
    cols = stored["option_columns"]
    assert all(set(cols[name]) == {"runs"} for name in RUN_COLUMNS)
    assert len(json.dumps(stored)) < len(json.dumps(_legacy(d)))


def test_busy_slices_and_full_shared_gpus_are_stored_as_codes(cases: dict[str, Decision]) -> None:
    d = cases["pending"]
    codes = d.to_dict(compact=True)["option_columns"]["reason"]
    assert REASON_NO_FREE_SLICE in codes and REASON_SHARED_FULL in codes
    words = [o.reason for o in d.options]
    assert any(w.startswith("insufficient free H100-80GB MIG ") for w in words)
    assert "shared H100-80GB: every shared GPU is at max_shared_jobs" in words


def test_malformed_runs_are_refused_with_the_column() -> None:
    d = _decide(flat_request("j", 20.0))["j"]
    stored = json.loads(json.dumps(d.to_dict(compact=True)))
    n = len(stored["option_columns"]["kind"])
    cases = {
        "cover 1 rows": {"runs": [[None, 1]]},
        "positive whole count": {"runs": [[None, n - 0.5], [None, 0.5]]},
        "must be a list or": {"rows": [[None, n]]},
    }
    for message, col in cases.items():
        bad = json.loads(json.dumps(stored))
        bad["option_columns"]["node"] = col
        with pytest.raises(SchedulerError, match=rf"option_columns\['node'\].*{message}"):
            Decision.from_dict(bad)
    no_kind = json.loads(json.dumps(stored))
    no_kind["option_columns"]["kind"] = {"runs": [["whole", n]]}
    with pytest.raises(SchedulerError, match="need 'kind' as a list"):
        Decision.from_dict(no_kind)
    # A runs column expands to one fresh value per row.
    rows = expand_runs(stored["option_columns"])["gpu_indices"]
    assert len(rows) == n and len({id(r) for r in rows}) == n


def test_same_shaped_jobs_store_the_columns_their_options_give() -> None:
    """A queue of identical jobs fills one class after another: their columns come from the
    per-pool template (all but the binding), each equal to the columns of the decision's own
    options, and each a fresh copy (changing one stored record changes no other)."""
    jobs = [flat_request(f"j{i}", 9.0) for i in range(12)]
    decided = list(_decide(*jobs, flat_request("big", 60.0, 2)).values())
    assert sum(d.state == "placed" for d in decided) >= 8
    got = [json.loads(json.dumps(d.to_dict(compact=True)["option_columns"])) for d in decided]
    for d in decided:  # every answer from here on is the template's
        again = d.to_dict(compact=True)["option_columns"]
        again["reason"][0] = "changed"
        again["gpu_type"]["runs"][0][1] = -1
    for d, want in zip(decided, got, strict=True):
        assert d.to_dict(compact=True)["option_columns"] == want, d.job_id
        full = Decision(d.job_id, d.policy, d.state, d.options, d.chosen, d.reason, d.runner_up)
        assert full.to_dict(compact=True)["option_columns"] == want, d.job_id


def test_compact_json_is_the_stored_record_byte_for_byte() -> None:
    """The leader writes Decision.compact_json (columns from JSON templates): the very bytes
    the store's dumps writes for to_dict(compact=True), templated or not."""
    from scheduler.service.store.records import dumps

    jobs = [flat_request(f"j{i}", 9.0) for i in range(12)]
    decided = list(_decide(*jobs, flat_request("big", 60.0, 2)).values())
    for _ in range(2):  # the second pass answers every job from the templates
        for d in decided:
            raw = d.compact_json()
            assert raw is not None and raw.decode() == dumps(d.to_dict(compact=True)), d.job_id
    pending = _filled(10)
    assert all(
        d.compact_json() is None
        for d in _decide(flat_request("p", 9.0), core=pending).values()
        if d.state != "placed"
    )
