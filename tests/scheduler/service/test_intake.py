"""Reading pending records back: out-of-bounds values are rejected with a reason, never raised
inside a step (real Redis)."""

from __future__ import annotations

import json

from scheduler.core.pool import load_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.protocol import Store
from tests.jobs import inference_spec as spec


def test_huge_reserved_gib_and_zero_vram_are_rejected_not_raised(store: Store) -> None:
    client = Client(store=store)
    good, huge, zero = client.submit_many([spec(i) for i in range(3)])
    store.set_fields(huge.id, {"reserved_gib": "1e308"})
    req = json.loads(zero.record()["request"])
    req["vram_gib"] = req["vram_upper_gib"] = [0.0] * 5
    store.set_fields(zero.id, {"request": json.dumps(req)})
    svc = SchedulerService(store, load_pool("datasets/pools/small.toml"))
    s = svc.step()
    assert s.placed == 1 and good.status() == "placed"
    assert huge.status() == "rejected" and "reserved_gib must be finite" in (huge.reason or "")
    assert zero.status() == "rejected" and "VRAM values must be in (0" in (zero.reason or "")
    svc.assert_consistent()


def test_request_decoder_answers_as_decode_request_per_job(store: Store) -> None:
    """Identical request texts are parsed once; each job still gets what decode_request gives
    it: its own id and submit time, its own refusal for a bad attempt, submit time or floor."""
    import dataclasses

    import numpy as np
    import pytest

    from scheduler.service._intake import InvalidRecord, RequestDecoder, decode_request

    pool = load_pool("datasets/pools/small.toml")
    client = Client(store=store)
    (h,) = client.submit_many([spec(0)])
    raw = h.record()["request"]
    decoder = RequestDecoder(pool)
    cases = [
        ("a", "pending", "0", "100.5", None),
        ("b", "pending", "2", "101.5", None),  # a hit: another id, attempt and time
        ("c", "pending", "0", "102.5", "30.0"),  # another floor: decoded afresh
        ("d", "pending", "0", "103.5", "30.0"),
        ("e", "pending", "x", "104.0", None),  # refusals on a hit, worded the same
        ("f", "pending", "0", "inf", None),
        ("g", "pending", "-1", "1.0", None),
        ("h", "placed", "0", "1.0", None),
        ("i", None, "0", "1.0", None),
    ]
    for jid, st, attempt, submitted, reserved in cases:
        try:
            want = decode_request(pool, jid, st, attempt, submitted, reserved, raw)
        except InvalidRecord as exc:
            with pytest.raises(InvalidRecord) as got:
                decoder(jid, st, attempt, submitted, reserved, raw)
            assert str(got.value) == str(exc)
            continue
        req = decoder(jid, st, attempt, submitted, reserved, raw)
        assert req.job_id == jid and req.submit_time_s == float(submitted)
        for f in dataclasses.fields(want):
            a, b = getattr(req, f.name), getattr(want, f.name)
            if isinstance(a, np.ndarray):
                assert np.array_equal(a, b), f.name
            else:
                assert a == b, f.name
