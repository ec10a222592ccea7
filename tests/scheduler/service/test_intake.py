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
