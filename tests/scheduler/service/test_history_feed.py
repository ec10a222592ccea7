"""History in live placement: a recurring job is answered by what its earlier runs measured,
on real Redis with a real (simulated) worker, and the leader rebuilds it after a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store import RedisStore
from tests.jobs import inference_spec as spec
from workers.worker import NodeWorker

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})


def _drain(store: RedisStore, tmp_path: Path) -> None:
    from workers.execute import set_context

    w = NodeWorker(
        store, "n1", pool=POOL, simulate=True, time_scale=1e-5, heartbeat_s=0.05,
        history_path=tmp_path / "h.jsonl", log_path=tmp_path / "log.jsonl",
    )  # fmt: skip
    set_context(w.ctx)
    try:
        SimpleWorker(
            [w.queue], connection=store.raw, serializer=JSONSerializer,
            job_class=w.rq_worker().job_class,
        ).work(burst=True)  # fmt: skip
    finally:
        set_context(None)


def _run_first(store: RedisStore, svc: SchedulerService, tmp_path: Path) -> None:
    h = Client(store=store).submit(spec("first"))
    svc.step()
    _drain(store, tmp_path)
    assert h.status() == "succeeded", h.reason
    assert not h.record()["method"].startswith("history:")
    row = json.loads(store.history()[-1])
    assert row["hardware"]["predicted_peak_gib"] > 0 and row["hardware"]["exit_ok"]


def _resubmit_and_check(store: RedisStore, svc: SchedulerService, tmp_path: Path) -> None:
    h = Client(store=store).submit(spec("again"))
    svc.step()
    assert h.record()["method"] == "history:1 runs"
    measured = json.loads(store.history()[-1])["peak_vram_gib"]
    req = json.loads(h.record()["history_request"])
    # The history point on the measured type is the measured peak; the bound is above it.
    assert req["vram_gib"][2] == pytest.approx(measured, rel=1e-3)
    assert req["vram_upper_gib"][2] > measured
    placed = [e for _, e in store.events() if e["event"] == "placed" and e["job_id"] == h.id]
    assert placed and placed[-1]["method"] == "history:1 runs"
    _drain(store, tmp_path)
    assert h.status() == "succeeded", h.reason


def test_resubmitted_job_is_answered_by_history(store: RedisStore, tmp_path: Path) -> None:
    svc = SchedulerService(store, POOL, simulated=True)
    _run_first(store, svc, tmp_path)
    _resubmit_and_check(store, svc, tmp_path)


def test_history_survives_a_scheduler_restart(store: RedisStore, tmp_path: Path) -> None:
    first = SchedulerService(store, POOL, simulated=True)
    _run_first(store, first, tmp_path)
    first.resign()
    del first
    # A new leader knows only Redis: it rebuilds the history from P:history.
    second = SchedulerService(store, POOL, simulated=True)
    _resubmit_and_check(store, second, tmp_path)


def test_a_real_leader_ignores_simulated_rows(store: RedisStore, tmp_path: Path) -> None:
    svc = SchedulerService(store, POOL)
    h0 = Client(store=store).submit(spec("first"))
    svc.step()
    _drain(store, tmp_path)
    assert h0.status() == "succeeded"
    h = Client(store=store).submit(spec("again"))
    svc.step()
    assert not h.record()["method"].startswith("history:")


def test_oom_row_becomes_a_floor_above_the_limit(store: RedisStore) -> None:
    from scheduler.service.history_feed import HistoryFeed

    row = {
        "spec": spec("x"), "gpu": "H100-80GB", "oom": True, "peak_vram_gib": 40.0,
        "simulated": True,
        "hardware": {"predicted_peak_gib": 20.0, "limit_gib": 40.0, "exit_ok": False},
    }  # fmt: skip
    store.append_history(json.dumps(row))
    feed = HistoryFeed(store, include_simulated=True)
    assert feed.poll() == 1
    from predictor.history import fingerprint_dict

    f = feed.history.predictor.factors(fingerprint_dict(spec("y")), ["H100-80GB", "A100-80GB"])
    assert f is not None and f.n_runs == 0  # no finished run: a floor, not a peak
    assert f.vram_floor[0] == pytest.approx(40.0 / 20.0 * 1.10)


def test_feed_reads_the_list_in_pages_and_only_new_rows(store: RedisStore) -> None:
    from scheduler.service.history_feed import HistoryFeed

    row = {
        "spec": spec("x"), "gpu": "H100-80GB", "oom": False, "peak_vram_gib": 22.0,
        "runtime_s": 10.0, "simulated": True,
        "hardware": {"predicted_peak_gib": 20.0, "predicted_runtime_s": 8.0, "exit_ok": True},
    }  # fmt: skip
    for _ in range(5):
        store.append_history(json.dumps(row))
    store.append_history("not json")
    feed = HistoryFeed(store, include_simulated=True)
    assert feed.poll(page=2) == 6 and feed.skipped == 1
    assert feed.poll(page=2) == 0
    store.append_history(json.dumps(row))
    assert feed.poll(page=2) == 1 and feed.history.rows == 6
