"""The dashboard in a real browser: a scheduler serving it (``snugfit scheduler --dashboard``)
and simulated workers as processes on real Redis, Debian's headless Chromium driven over the
DevTools protocol by Playwright. Without Chromium (or Playwright) it skips and says why."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from scheduler.service.client import Client
from scheduler.service.store.redis_store import RedisStore
from tests.browser import chromium
from tests.jobs import inference_spec as spec
from tests.scheduler.dashboard._procs import served_url, start, wait_for

pytestmark = pytest.mark.skipif(
    chromium() is None,
    reason="chromium is not installed: the dashboard's browser test drives Debian's headless "
    "`chromium` (apt-get install chromium; .ci/run installs it)",
)
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="playwright is not installed: it is in the dev extra (pip install -e '.[dev]')",
)

POOL_TOML = """name = "browser"
[[nodes]]
name = "n1"
gpu = "H100-80GB"
count = 2
[[nodes]]
name = "m1"
gpu = "A100-80GB"
count = 1
mode = "mig"
mig = "dynamic"
"""
_WAIT_MS = 60_000


def _launch(p: Any) -> Any:
    return p.chromium.launch(
        executable_path=chromium(),
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
    )


def test_dashboard_in_headless_chromium(
    redis_url: str,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    pool_file = tmp_path / "pool.toml"
    pool_file.write_text(POOL_TOML)
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "scheduler.log"
    sched = start(
        ["scheduler", "--pool", str(pool_file), "--simulated", "--dashboard",
         "--metrics-port", "0", "--log-file", str(tmp_path / "placement.jsonl")],
        redis_url, home, log,
    )  # fmt: skip
    procs.append(sched)
    for node in ("n1", "m1"):
        args = ["worker", "--node", node, "--pool", str(pool_file), "--simulate", "--time-scale",
                "0.01", "--heartbeat", "0.2", "--node-heartbeat", "0.5"]  # fmt: skip
        procs.append(start(args, redis_url, home, tmp_path / f"worker-{node}.log"))
    url = served_url(sched, log)
    store = RedisStore(redis.Redis.from_url(redis_url))
    wait_for(lambda: {"n1", "m1"} <= set(store.nodes()), 90, "both workers to register")
    client = Client(store=store)

    with sync_api.sync_playwright() as p:
        browser = _launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        # The pool renders: every node and GPU of the pool file.
        page.goto(url)
        page.wait_for_selector('section.node[data-node="m1"]', timeout=_WAIT_MS)
        assert page.locator("section.node").count() == 2
        assert page.locator("tr.gpu").count() == 3
        assert page.locator('section.node[data-node="m1"] .mig').count() == 1

        # A job submitted while the queue page is open appears on it without a reload.
        page.goto(url + "queue")
        page.wait_for_selector("table#recent", timeout=_WAIT_MS)
        client.submit(spec("web-1"))
        page.wait_for_selector('tr[data-job="job-web-1"]', timeout=_WAIT_MS)

        # Its job page shows the explain table with the chosen option.
        page.locator('a[href="/job/job-web-1"]').first.click()
        page.wait_for_selector("table#explain tr.chosen", timeout=_WAIT_MS)
        chosen = page.locator("table#explain tr.chosen td.status").inner_text()
        assert chosen == "CHOSEN"
        options = page.locator("table#explain tbody tr").count()
        decision = client.get("job-web-1").decision
        assert decision is not None and options == len(decision["options"])
        assert page.locator("table#breakdown").count() == 1
        # Once the simulated worker ran it, the live page adds predicted vs actual.
        client.get("job-web-1").wait(timeout=120)
        page.wait_for_selector("table#vs-actual", timeout=_WAIT_MS)
        assert "simulated run" in page.locator("#live").inner_text()

        # The placement log page receives new entries live (server-sent events).
        page.goto(url + "log")
        page.wait_for_selector("table#log", timeout=_WAIT_MS)
        client.submit(spec("web-2"))
        page.wait_for_selector('table#log td a[href="/job/job-web-2"]', timeout=_WAIT_MS)

        # Cost and GPU-hours: the chart library draws both charts.
        client.get("job-web-2").wait(timeout=120)
        page.goto(url + "usage")
        page.wait_for_selector("#cost-chart .uplot canvas", timeout=_WAIT_MS)
        page.wait_for_selector("#hours-chart .uplot canvas", timeout=_WAIT_MS)
        page.screenshot(path=str(tmp_path / "usage.png"))
        assert errors == []  # no script failed on any page
        browser.close()

    # The scheduler serves its Prometheus metrics on the same port.
    metrics = httpx.get(url + "metrics", timeout=10).text
    assert 'snugfit_jobs{state="succeeded"} 2.0' in metrics
    usage = httpx.get(url + "api/usage", timeout=10).json()
    assert usage["totals"]["attempts"] >= 2 and usage["simulated"] is True
    assert json.loads(json.dumps(usage))["cost_usd"][-1] > 0
