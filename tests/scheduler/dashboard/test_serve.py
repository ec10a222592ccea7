"""Serving the dashboard: ``snugfit dashboard`` as a process, and the in-process server the
scheduler and the demo use (real uvicorn, real Redis, HTTP over loopback)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
from click.testing import CliRunner

from scheduler.cli.dashboard import dashboard_command
from scheduler.core.pool import Pool
from scheduler.dashboard.app import create_app
from scheduler.dashboard.server import start_in_thread
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import Procs
from tests.scheduler.dashboard._procs import served_url, start

POOL = Pool.from_dict({"name": "one", "nodes": [{"name": "n1", "gpu": "H100-80GB", "count": 2}]})


def test_dashboard_command_serves_on_loopback_and_stops_on_sigterm(
    redis_url: str, store: RedisStore, tmp_path: Path, procs: Procs
) -> None:
    Client(store=store).submit(spec(0))
    SchedulerService(store, POOL).step()
    log = tmp_path / "dashboard.log"
    p = start(["dashboard", "--port", "0", "--redis", redis_url], redis_url, tmp_path, log)
    procs.append(p)
    url = served_url(p, log)
    assert url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    assert httpx.get(url + "healthz", timeout=10).json() == {"ok": True}
    page = httpx.get(url, timeout=10)
    assert page.status_code == 200 and 'data-node="n1"' in page.text
    assert "job-0" in httpx.get(url + "queue", timeout=10).text
    p.terminate()
    # uvicorn stops, then re-raises the signal it caught (exit status -SIGTERM).
    assert p.wait(timeout=20) in (0, -signal.SIGTERM)


def test_dashboard_command_names_the_fix_when_the_port_is_taken(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        got = CliRunner().invoke(dashboard_command, ["--port", str(port), "--redis", redis_url])
    assert got.exit_code == 1
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in got.output
    assert "--port (0 picks one)" in got.output


def test_in_process_server_starts_serves_and_stops(store: RedisStore) -> None:
    dash = start_in_thread(create_app(store))
    try:
        assert httpx.get(dash.url + "healthz", timeout=10).status_code == 200
        # An open event stream does not hold the shutdown up.
        with httpx.stream("GET", dash.url + "api/events/stream", timeout=10) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            first = next(resp.iter_lines())
            assert first == "retry: 2000"
            dash.stop()
    finally:
        dash.stop()
    assert not dash.thread.is_alive()
    with socket.socket() as s:
        host, port = dash.url.removeprefix("http://").rstrip("/").split(":")
        assert s.connect_ex((host, int(port))) != 0  # nothing listens any more
