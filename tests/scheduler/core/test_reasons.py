"""A stored decision keeps reasons its rows word as codes; reading it gives the same words."""

from __future__ import annotations

import json

import pytest

from scheduler.core.decision import Decision
from scheduler.core.pool import Pool
from scheduler.core.reasons import REASON_COSTLIER, REASON_TOO_SMALL
from scheduler.core.requests import PlacementRequest
from scheduler.exceptions import SchedulerError
from scheduler.policies.rightsize import RightSizePolicy


def _placed() -> Decision:
    # A MIG-partitioned A100 next to whole ones: small slices are too small for a 20 GiB job,
    # the whole GPUs that lose cost more.
    pool = Pool.from_dict(
        {
            "nodes": [
                {"name": "a", "gpu": "A100-80GB", "count": 2},
                {"name": "b", "gpu": "H100-80GB", "count": 1, "mode": "mig", "mig": "dynamic"},
            ]
        }
    )
    req = PlacementRequest("j", [20.0] * 5, [22.0] * 5, [100.0] * 5, [120.0] * 5)
    (d,) = RightSizePolicy(backfill=False).schedule([req], pool.state(), 0.0)
    assert d.state == "placed"
    return d


def test_coded_reasons_read_back_in_the_same_words() -> None:
    d = _placed()
    compact = json.loads(json.dumps(d.to_dict(compact=True)))
    codes = compact["option_columns"]["reason"]
    assert REASON_COSTLIER in codes and REASON_TOO_SMALL in codes
    words = [o["reason"] for o in d.to_dict()["options"]]
    assert any(w.startswith("costs $") for w in words)
    assert any(w.endswith("GiB > 9.9 GiB") or w.endswith("GiB > 10.0 GiB") for w in words)
    back = Decision.from_dict(compact)
    assert [o.reason for o in back.options] == words
    assert back == d
    # Built from the Options (a decision read back), the compact form is the same record.
    assert back.to_dict(compact=True) == compact


def test_bad_codes_are_refused_with_the_row() -> None:
    compact = json.loads(json.dumps(_placed().to_dict(compact=True)))
    reasons = compact["option_columns"]["reason"]
    i = reasons.index(REASON_COSTLIER)
    unknown = json.loads(json.dumps(compact))
    unknown["option_columns"]["reason"][i] = 7
    with pytest.raises(SchedulerError, match=f"row {i}: unknown reason code 7"):
        Decision.from_dict(unknown)
    no_cost = json.loads(json.dumps(compact))
    no_cost["option_columns"]["cost_usd"][i] = "cheap"
    with pytest.raises(SchedulerError, match=f"row {i}: a coded reason needs a number"):
        Decision.from_dict(no_cost)
    unchosen = {**compact, "chosen": None, "state": "pending"}
    with pytest.raises(SchedulerError, match="needs a chosen option"):
        Decision.from_dict(unchosen)
