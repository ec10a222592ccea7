"""Per-user and per-team metrics: labels from the job records, bounded cardinality."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.service.client import Client
from scheduler.service.store.redis_store import RedisStore
from scheduler.service.telemetry import Telemetry
from tests.jobs import inference_spec as spec
from tests.scheduler.service._simpool import SimPool


def _total(t: Telemetry, metric: str) -> float:
    """The sum of a counter's ``_total`` samples over every label set."""
    return sum(
        s.value
        for m in t.registry.collect()
        if m.name == metric
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_user_series_are_bounded_and_sum_to_the_accounting(
    store: RedisStore, tmp_path: Path
) -> None:
    client = Client(store=store)
    client.submit_many([spec(i, user=f"u{i}", team="a" if i < 3 else "b") for i in range(5)])
    SimPool(store, tmp_path).run_until_idle(client)
    t = Telemetry(store.raw, keys=store.keys, max_users=2, max_teams=1)
    t.poll_events()

    def v(name: str, user: str, team: str) -> float:
        return float(t.registry.get_sample_value(name, {"user": user, "team": team}) or 0.0)

    names = {
        s.labels["user"]
        for m in t.registry.collect()
        if m.name == "snugfit_user_placements"
        for s in m.samples
    }
    assert names == {"u0", "u1", "other"}  # 2 users by name, the rest as other
    assert v("snugfit_user_placements_total", "u0", "a") == 1
    assert v("snugfit_user_placements_total", "other", "a") == 1  # u2, team a
    assert v("snugfit_user_placements_total", "other", "other") == 2  # u3, u4: team b
    acct = client.acct()["total"]
    cost, hours = _total(t, "snugfit_user_cost_usd"), _total(t, "snugfit_user_gpu_hours")
    assert cost == pytest.approx(acct["cost_usd"]) and cost > 0
    assert hours == pytest.approx(acct["gpu_hours"]) and hours > 0
