"""The dashboard's pages and JSON over a real Redis, driven by the real client, scheduler
service and a simulated node worker (Starlette's TestClient; no browser)."""

from __future__ import annotations

import json
import re
import threading
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from rich.console import Console
from starlette.testclient import TestClient

from scheduler.cli.render import decision_table
from scheduler.core.decision import Decision
from scheduler.core.pool import Pool
from scheduler.dashboard.app import DashboardConfig, create_app
from scheduler.dashboard.usage import usage_series
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from scheduler.service.telemetry import Telemetry
from tests.jobs import inference_spec as spec
from workers.worker import NodeWorker

REPO = Path(__file__).resolve().parents[3]
POOL = Pool.from_dict(
    {
        "name": "web",
        "nodes": [
            {"name": "n1", "gpu": "H100-80GB", "count": 2},
            {"name": "m1", "gpu": "A100-80GB", "count": 1, "mode": "mig", "mig": "dynamic"},
            {"name": "s1", "gpu": "H200-141GB", "count": 1, "mode": "shared",
             "max_shared_jobs": 4},
        ],
    }
)  # fmt: skip
# Two GPUs of one node, pinned: the first holds n1, the second waits for it.
PAIR: dict[str, Any] = {"gpu": "H100-80GB", "n_gpus": 2, "tensor_parallel": 2}


def _placed_cluster(store: RedisStore) -> Client:
    """Small jobs on the shared and MIG nodes, one 2-GPU job on n1, one waiting for n1, one
    that fits nowhere: one scheduler step, as the service runs it."""
    client = Client(store=store)
    client.submit_many(
        [spec(k) for k in range(4)]
        + [spec("pair-a", **PAIR), spec("pair-b", **PAIR)]
        + [spec("huge", model="llama-3.1-70b", n_gpus=8, tensor_parallel=8)]
    )
    SchedulerService(store, POOL).step()
    return client


def test_before_a_scheduler_publishes_a_pool_the_pages_say_so(store: RedisStore) -> None:
    web = TestClient(create_app(store))
    page = web.get("/")
    assert page.status_code == 200 and "No pool published yet" in page.text
    assert web.get("/api/pool").json()["nodes"] == []
    queue = web.get("/queue")
    assert queue.status_code == 200 and "no jobs submitted yet" in queue.text
    assert web.get("/api/usage").json()["totals"]["attempts"] == 0
    assert web.get("/healthz").json() == {"ok": True}


def test_pool_shows_reserved_and_used_vram_the_mig_layout_and_each_slot(
    store: RedisStore,
) -> None:
    _placed_cluster(store)
    web = TestClient(create_app(store))
    pool = web.get("/api/pool").json()
    assert pool["name"] == "web" and pool["n_gpus"] == 4
    nodes = {n["name"]: n for n in pool["nodes"]}
    allocs = {j: json.loads(a) for j, a in store.allocations().items()}
    # Every allocation appears on each of its GPUs, with what it reserved there.
    for jid, a in allocs.items():
        for g in a["gpus"]:
            gpu = next(x for n in nodes.values() for x in n["gpus"] if x["index"] == g)
            slot = next(s for s in gpu["slots"] if s["job_id"] == jid)
            assert slot["reserved_gib"] == pytest.approx(a["reserved_mib"] / 1024, abs=1e-3)
    for n in nodes.values():
        for g in n["gpus"]:
            assert g["reserved_gib"] == pytest.approx(sum(s["reserved_gib"] for s in g["slots"]))
            assert g["used_gib"] is None or g["used_gib"] <= g["reserved_gib"] + 1e-6
    n1 = nodes["n1"]["gpus"]
    assert (
        [s["job_id"] for s in n1[0]["slots"]]
        == ["job-pair-a"]
        == [s["job_id"] for s in n1[1]["slots"]]
    )
    mig = nodes["m1"]["gpus"][0]["mig"]
    assert mig is not None and sum(c["width"] for c in mig["cells"]) == 8
    held = {c["job_id"] for c in mig["cells"] if c["job_id"]}
    assert held == {j for j, a in allocs.items() if a["option"]["kind"] == "mig"}
    assert mig["free_memory"] == sum(c["width"] for c in mig["cells"] if c["job_id"] is None)
    html = web.get("/").text
    for jid in allocs:
        assert f'href="/job/{jid}"' in html
    assert 'data-node="m1"' in html and 'class="mig"' in html
    assert web.get("/fragment/pool").text.count('class="gpu"') == 4


def test_queue_lists_active_jobs_with_pending_reasons(store: RedisStore) -> None:
    _placed_cluster(store)
    web = TestClient(create_app(store))
    queue = web.get("/api/queue").json()
    by_id = {j["id"]: j for j in queue["jobs"]}
    assert by_id["job-pair-b"]["state"] == "pending"
    assert by_id["job-pair-b"]["reason"].startswith("Reason=Resources")
    assert by_id["job-pair-a"]["state"] == "placed"
    assert by_id["job-pair-a"]["option"] == "H100-80GB x2" and by_id["job-pair-a"]["node"] == "n1"
    assert "job-huge" not in by_id  # rejected: not in the queue, but among the newest jobs
    recent = {j["id"]: j for j in queue["recent"]}
    assert (
        recent["job-huge"]["state"] == "rejected" and "fits nowhere" in recent["job-huge"]["reason"]
    )
    assert queue["counts"]["pending"] == 1 and queue["counts"]["rejected"] == 1
    html = web.get("/queue").text
    assert "Reason=Resources" in html and 'data-job="job-pair-b"' in html


def test_a_deep_queue_lists_its_oldest_jobs_and_counts_the_rest(store: RedisStore) -> None:
    Client(store=store).submit_many([spec(f"p{k:02d}", **PAIR) for k in range(12)])
    SchedulerService(store, POOL).step()  # one pair holds n1, eleven wait
    web = TestClient(create_app(store))
    queue = web.get("/api/queue?limit=4").json()
    assert [(j["id"], j["state"]) for j in queue["jobs"]] == [("job-p00", "placed")] + [
        (f"job-p{k:02d}", "pending") for k in (1, 2, 3)
    ]
    assert queue["more"] == 8
    assert all(j["reason"].startswith("Reason=Resources") for j in queue["jobs"][1:])
    page = web.get("/queue?limit=4").text
    assert 'data-fragment="/fragment/queue?limit=4"' in page and "8 more active jobs" in page


def test_queue_filters_by_state_user_and_team(store: RedisStore) -> None:
    _placed_cluster(store)
    # Who ran a job, as the client's record fields carry it.
    store.set_fields("job-pair-b", {"user": "alice", "team": "nlp"})
    store.set_fields("job-0", {"user": "bob", "team": "nlp"})
    web = TestClient(create_app(store))

    def listed(query: str) -> tuple[list[str], list[str]]:
        q = web.get("/api/queue?" + query).json()
        return [j["id"] for j in q["jobs"]], [j["id"] for j in q["recent"]]

    jobs, recent = listed("state=pending")
    assert jobs == ["job-pair-b"] and recent == ["job-pair-b"]
    assert listed("state=rejected")[0] == ["job-huge"]  # a finished state: the newest jobs
    assert set(listed("state=placed,pending")[0]) == set(listed("")[0])
    assert listed("user=alice") == (["job-pair-b"], ["job-pair-b"])
    assert set(listed("team=nlp")[0]) == {"job-pair-b", "job-0"}
    assert listed("user=alice&team=nlp")[0] == ["job-pair-b"]
    assert listed("user=carol") == ([], [])
    page = web.get("/queue?user=alice").text
    assert 'value="alice"' in page and 'data-fragment="/fragment/queue?user=alice"' in page
    assert "alice" in page and "(nlp)" in page


def test_job_page_shows_the_explain_table_in_the_cli_order(store: RedisStore) -> None:
    client = _placed_cluster(store)
    web = TestClient(create_app(store))
    job = web.get("/api/job/job-0").json()
    decision = client.get("job-0").decision
    assert decision is not None
    d = Decision.from_dict(decision)
    rows = job["decision"]["rows"]
    assert len(rows) == len(d.options) and rows[0]["chosen"] and rows[0]["status"] == "CHOSEN"
    assert sum(r["chosen"] for r in rows) == 1
    # The same rows, in the same order and words, as `snugfit explain` prints.
    console = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(decision_table(d, max_rows=10_000))
    cli_rows = [
        [c.strip() for c in line.split("│")[2:-1]]
        for line in console.export_text().splitlines()
        if line.startswith("│")
    ]
    assert [(r[0], r[-1]) for r in cli_rows] == [(r["label"], r["status"]) for r in rows]
    assert job["breakdown"]["gpu"] == d.chosen_option.gpu_type  # type: ignore[union-attr]
    assert {r["component"] for r in job["breakdown"]["rows"]} >= {"weights", "overhead"}
    assert job["predicted_vs_actual"] is None  # not run yet
    assert [e["event"] for e in job["events"]] == ["placed"]
    assert "job-0" in job["cli_text"] and "CHOSEN" in job["cli_text"]
    html = web.get("/job/job-0").text
    assert '<table class="explain" id="explain">' in html and "CHOSEN" in html
    pending = web.get("/api/job/job-pair-b").json()
    assert pending["pending_reason"].startswith("Reason=Resources")
    assert web.get("/job/no-such-job").status_code == 404
    assert web.get("/api/job/no-such-job").status_code == 404


def test_odd_job_ids_route_and_are_escaped(store: RedisStore) -> None:
    odd = "a/b <i>x</i>"
    Client(store=store).submit(spec(0, id=odd))
    SchedulerService(store, POOL).step()
    web = TestClient(create_app(store))
    page = web.get("/job/" + quote(odd, safe=""))
    assert page.status_code == 200
    assert "a/b &lt;i&gt;x&lt;/i&gt;" in page.text and "<i>x</i>" not in page.text
    assert web.get("/api/job/" + quote(odd, safe="")).json()["id"] == odd
    assert "<i>x</i>" not in web.get("/queue").text


def test_corrupt_records_never_break_a_page(store: RedisStore) -> None:
    """Anyone who can write to Redis can write anything: each page still renders, showing
    what it can read."""
    _placed_cluster(store)
    r = store.r
    r.hset(store.keys.job("job-1"), mapping={"decision": "{not json", "spec": "[1, 2]"})
    r.hset(store.keys.job("job-pair-b"), mapping={"request": '{"vram_gib": "lots"}'})
    r.hset(store.keys.job("job-2"), mapping={"placement": "null", "outcome": '"x"'})
    r.hset(store.keys.allocs, "ghost", "{broken")
    r.hset(store.keys.allocs, "ghost-2", json.dumps({"option": {"kind": "nope"}, "gpus": [0]}))
    store.emit([{"event": "finished", "job_id": "job-0", "attempt": "one", "outcome": 7}])
    r.xadd(store.keys.events, {"e": "\xff not json"})
    web = TestClient(create_app(store))
    for path in ("/", "/queue", "/log", "/usage", "/job/job-1", "/job/job-pair-b", "/job/job-2"):
        assert web.get(path).status_code == 200, path
    for path in ("/api/pool", "/api/queue", "/api/usage", "/api/job/job-1", "/api/events"):
        assert web.get(path).status_code == 200, path
    job = web.get("/api/job/job-1").json()
    assert job["decision"] is None and job["model"] is None  # unreadable, not guessed


def _run_on_workers(store: RedisStore, tmp_path: Path) -> None:
    """Simulated workers on every node drain their queues (one burst each), as
    `snugfit worker --simulate` does, until nothing is left to place."""
    svc = SchedulerService(store, POOL)
    for _ in range(4):
        svc.step()
        for node in ("n1", "m1", "s1"):
            w = NodeWorker(store, node, simulate=True, time_scale=1e-4, pool=POOL,
                           heartbeat_s=0.05, history_path=tmp_path / f"{node}.jsonl")  # fmt: skip
            w.work(burst=True)


def test_finished_jobs_show_predicted_vs_actual_and_usage_bills_them(
    store: RedisStore, tmp_path: Path
) -> None:
    client = Client(store=store)
    client.submit_many([spec(k) for k in range(3)] + [spec("pair-a", **PAIR)])
    _run_on_workers(store, tmp_path)
    assert {h.status() for h in client.jobs()} == {"succeeded"}
    web = TestClient(create_app(store))
    job = web.get("/api/job/job-pair-a").json()
    vs = job["predicted_vs_actual"]
    assert vs["simulated"] is True and [r["what"] for r in vs["rows"]] == [
        "peak VRAM GiB",
        "runtime",
    ]
    assert vs["rows"][0]["actual"] != "-" and vs["rows"][0]["ratio"].endswith("x")
    assert "simulated run" in web.get("/job/job-pair-a").text
    # Usage: the chosen option's cost for the measured runtime, summed over every attempt,
    # checked against the placement log.
    events = [e for _, e in store.events()]
    placed = {(e["job_id"], e["attempt"]): e["option"] for e in events if e["event"] == "placed"}
    expected = 0.0
    for e in events:
        if e["event"] == "finished":
            o = placed[(e["job_id"], e["attempt"])]
            expected += o["cost_usd"] * e["outcome"]["runtime_s"] / o["runtime_s"]
    usage = web.get("/api/usage").json()
    assert usage["totals"]["attempts"] == 4 and usage["simulated"] is True
    assert usage["totals"]["cost_usd"] == pytest.approx(expected, rel=1e-6)
    assert usage["cost_usd"][-1] == pytest.approx(expected, rel=1e-6)
    assert usage["cost_usd"] == sorted(usage["cost_usd"]) and usage["t"] == sorted(usage["t"])
    assert sum(usage["totals"]["cost_by_type"].values()) == pytest.approx(expected, rel=1e-6)
    h100 = next(e for e in events if e["event"] == "finished" and e["job_id"] == "job-pair-a")
    assert usage["totals"]["gpu_hours"] >= 2 * h100["outcome"]["runtime_s"] / 3600 * (1 - 1e-9)
    page = web.get("/usage").text
    assert 'id="cost-chart"' in page and "uPlot.iife.min.js" in page and "simulated runs" in page
    # The second read only tails what is new: the same totals, no double counting.
    assert web.get("/api/usage").json()["totals"] == usage["totals"]


def test_usage_series_downsamples_to_the_same_totals() -> None:
    from scheduler.dashboard.usage import BilledAttempt

    billed = [BilledAttempt(f"j{k}", 1, 1000.0 + k, "H100-80GB" if k % 2 else "A100-40GB",
                            1.0 + k, 0.5, True) for k in range(1000)]  # fmt: skip
    s = usage_series(billed, max_points=50)
    assert len(s["t"]) == 50 and s["t"][-1] == billed[-1].ended_at
    assert s["cost_usd"][-1] == pytest.approx(sum(b.cost_usd for b in billed))
    assert s["gpu_hours"][-1] == pytest.approx(500.0)
    assert s["cost_by_type"]["H100-80GB"][-1] + s["cost_by_type"]["A100-40GB"][-1] == (
        pytest.approx(s["cost_usd"][-1])
    )


def _frames(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in fields:
            out.append(fields)
    return out


def test_event_stream_replays_from_an_id_and_then_follows(store: RedisStore) -> None:
    _placed_cluster(store)
    ids = [eid for eid, _ in store.events()]
    web = TestClient(create_app(store, config=DashboardConfig(stream_poll_s=0.02)))
    with web.stream("GET", f"/api/events/stream?after={ids[1]}&max_events=3") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = _frames(resp.read().decode())
    assert [f["id"] for f in frames] == ids[2:5]
    assert all(f["event"] == "placement" for f in frames)
    first = json.loads(frames[0]["data"])
    assert first["id"] == ids[2] and first["line"] and first["event"] in ("placed", "rejected")
    # Without ?after, the stream starts from now: only events appended after it opened.
    done = threading.Event()

    def emit_until_read() -> None:
        while not done.wait(0.05):
            store.emit([{"ts": 1.0, "event": "cancelled", "job_id": "later", "reason": "t"}])

    t = threading.Thread(target=emit_until_read, daemon=True)
    t.start()
    try:
        with web.stream("GET", "/api/events/stream?max_events=1") as resp:
            (frame,) = _frames(resp.read().decode())
    finally:
        done.set()
        t.join()
    assert json.loads(frame["data"])["job_id"] == "later" and frame["id"] not in ids


def test_log_page_starts_with_the_newest_events(store: RedisStore) -> None:
    _placed_cluster(store)
    web = TestClient(create_app(store, config=DashboardConfig(log_rows=3)))
    html = web.get("/log").text
    ids = [eid for eid, _ in store.events()]
    assert re.findall(r'<tr class="event [^"]*" data-id="([^"]+)"', html) == ids[-3:][::-1]
    assert f'data-after="{ids[-1]}"' in html
    assert [e["id"] for e in web.get("/api/events?limit=2").json()] == ids[-2:]


def test_metrics_are_served_beside_the_pages_when_the_scheduler_serves_them(
    store: RedisStore,
) -> None:
    _placed_cluster(store)
    web = TestClient(create_app(store, telemetry=Telemetry(store.raw, keys=store.keys)))
    metrics = web.get("/metrics")
    assert metrics.status_code == 200
    assert 'snugfit_jobs{state="pending"} 1.0' in metrics.text
    assert "snugfit_placements_total" in metrics.text
    assert TestClient(create_app(store)).get("/metrics").status_code == 404


def test_an_unreachable_redis_is_a_503_that_names_the_fix() -> None:
    down = RedisStore(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2))
    web = TestClient(create_app(down))
    page = web.get("/")
    assert page.status_code == 503 and "Is Redis reachable" in page.text
    api = web.get("/api/queue")
    assert api.status_code == 503 and "Is Redis reachable" in api.json()["error"]
    assert web.get("/healthz").status_code == 503


def test_templates_and_static_files_are_package_data() -> None:
    root = REPO / "scheduler/dashboard"
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["scheduler.dashboard"]
    files = [
        p.relative_to(root).as_posix()
        for d in ("templates", "static")
        for p in (root / d).rglob("*")
        if p.is_file()
    ]
    assert files and all(any(fnmatch(f, g) for g in globs) for f in files)
    js = (root / "static/vendor/uPlot.iife.min.js").read_text()
    assert js.startswith("/*! https://github.com/leeoniya/uPlot")
    assert "MIT License" in (root / "static/vendor/uPlot.LICENSE").read_text()


def test_dashboard_public_api_resolves() -> None:
    import scheduler.dashboard as dash

    assert dash.__all__ and all(getattr(dash, name) is not None for name in dash.__all__)
