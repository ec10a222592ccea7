"""Prometheus metrics: queue depth and event-derived counters read from a real Redis."""

from __future__ import annotations

import socket
import time
import urllib.request
from typing import Any

import redis

from scheduler.service.store.keys import Keys
from scheduler.service.store.redis_store import RedisStore
from scheduler.service.telemetry import Telemetry, start_metrics_server


def _value(t: Telemetry, name: str, labels: dict[str, str] | None = None) -> float | None:
    v = t.registry.get_sample_value(name, labels or {})
    return None if v is None else float(v)


def _opt(gpu: str = "H100-80GB", kind: str = "whole") -> dict[str, Any]:
    return {"gpu_type": gpu, "kind": kind, "vram_gib": 20.0, "runtime_s": 100.0}


def _events() -> list[dict[str, Any]]:
    return [
        {"event": "placed", "job_id": "a", "option": _opt(), "policy": "rightsize"},
        {"event": "placed", "job_id": "b", "option": _opt("A100-80GB", "mig"),
         "policy": "rightsize"},
        # Workers' finished events carry no option: it comes from the placed event.
        {"event": "finished", "job_id": "a",
         "outcome": {"peak_vram_gib": 18.0, "runtime_s": 110.0}},
        {"event": "oom", "job_id": "b", "option": _opt("A100-80GB", "mig"),
         "outcome": {"peak_vram_gib": 30.0, "runtime_s": 5.0, "oom": True}},
        {"event": "reclaimed", "job_id": "c"},
        {"event": "nonsense"},
    ]  # fmt: skip


def test_ingest_event_counts_placements_ooms_reclaims_and_ratios() -> None:
    t = Telemetry()
    for e in _events():
        t.ingest_event(e)
    assert (
        _value(
            t,
            "snugfit_placements_total",
            {"gpu_type": "H100-80GB", "kind": "whole", "policy": "rightsize"},
        )
        == 1
    )
    assert _value(t, "snugfit_oom_kills_total", {"gpu_type": "A100-80GB"}) == 1
    assert _value(t, "snugfit_reclaimed_leases_total") == 1
    assert _value(t, "snugfit_prediction_vram_ratio_count", {"gpu_type": "H100-80GB"}) == 1
    assert _value(t, "snugfit_prediction_vram_ratio_sum", {"gpu_type": "H100-80GB"}) == 0.9
    # OOM attempts count for VRAM (the miss) but not runtime (the run was cut short).
    assert _value(t, "snugfit_prediction_vram_ratio_count", {"gpu_type": "A100-80GB"}) == 1
    assert _value(t, "snugfit_prediction_runtime_ratio_count", {"gpu_type": "A100-80GB"}) is None
    assert _value(t, "snugfit_prediction_runtime_ratio_sum", {"gpu_type": "H100-80GB"}) == 1.1
    assert _value(t, "snugfit_events_total", {"event": "placed"}) == 2


def test_placement_latency_histogram() -> None:
    t = Telemetry()
    t.observe_placement_latency(0.004)
    t.observe_placement_latency(float("nan"))
    assert _value(t, "snugfit_placement_latency_seconds_count") == 1
    assert _value(t, "snugfit_placement_latency_seconds_bucket", {"le": "0.005"}) == 1
    assert _value(t, "snugfit_placement_latency_seconds_bucket", {"le": "0.0025"}) == 0


def test_redis_collector_reads_queue_depth_and_tails_the_stream(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    client.sadd(keys.state("pending"), "x", "y")
    client.sadd(keys.state("running"), "z")
    store = RedisStore(client)
    store.emit(_events()[:2])
    t = Telemetry(client)
    assert _value(t, "snugfit_jobs", {"state": "pending"}) == 2
    assert _value(t, "snugfit_jobs", {"state": "running"}) == 1
    assert _value(t, "snugfit_redis_up") == 1
    placed = {"gpu_type": "H100-80GB", "kind": "whole", "policy": "rightsize"}
    assert _value(t, "snugfit_placements_total", placed) == 1
    store.emit(_events()[:1])
    # Every scrape reads only what is new: no double counting.
    assert _value(t, "snugfit_placements_total", placed) == 2
    assert _value(t, "snugfit_placements_total", placed) == 2
    client.xadd(keys.events, {"e": "{not json"})
    assert t.poll_events() == 1
    store.close()


def test_collector_reports_redis_down_instead_of_failing() -> None:
    dead = redis.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=0.2)
    t = Telemetry(dead)
    assert _value(t, "snugfit_redis_up") == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_endpoint_serves_prometheus_text(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    RedisStore(client).emit(_events())
    port = _free_port()
    t, server = start_metrics_server(port, client, addr="127.0.0.1")
    try:
        t.observe_placement_latency(0.01)
        body = ""
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.05)
        assert "# TYPE snugfit_placement_latency_seconds histogram" in body
        assert 'snugfit_oom_kills_total{gpu_type="A100-80GB"} 1.0' in body
        assert "snugfit_reclaimed_leases_total 1.0" in body
        assert 'snugfit_jobs{state="pending"} 0.0' in body
    finally:
        server.shutdown()


def test_metrics_endpoint_binds_loopback_by_default() -> None:
    port = _free_port()
    _t, server = start_metrics_server(port)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()


def test_scheduler_command_has_metrics_host_flag() -> None:
    from click.testing import CliRunner

    from scheduler.cli import cli

    out = CliRunner().invoke(cli, ["scheduler", "--help"]).output
    assert "--metrics-host" in out and "127.0.0.1" in out
