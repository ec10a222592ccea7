"""Screenshots of the live web dashboard while ``snugfit demo`` runs (simulated workers), for
the README.

    python benchmarks/dashboard_screenshot.py [--out-dir benchmarks/results] [--jobs 300]

It starts ``snugfit demo --no-live --dashboard-port PORT`` as a process, waits for the URL it
prints and for jobs to run, then opens the pool page and the page of a running job in
headless Chromium (Debian's ``chromium``, driven by Playwright) and writes
``dashboard-pool.png`` and ``dashboard-job.png``. The demo then finishes on its own.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks/results")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=860)
    args = ap.parse_args()
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None:
        sys.exit("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="snugfit-shot-")) / "demo.log"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        demo = subprocess.Popen(
            [sys.executable, "-c", "from scheduler.cli import main; main()", "demo",
             "--no-live", "--jobs", str(args.jobs), "--dashboard-port", str(port)],
            cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 300
        while not re.search(r"live dashboard: ", log.read_text()):
            if demo.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the demo did not serve its dashboard; see {log}")
            time.sleep(0.2)
        running: list[dict] = []  # type: ignore[type-arg]
        while len(running) < 10 and time.monotonic() < deadline:
            running = [j for j in _get(url + "api/queue")["jobs"] if j["state"] == "running"]
            time.sleep(0.5)
        job = max(running, key=lambda j: j["runtime_s"] or 0.0)  # a long one: it stays running
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=browser_path,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(url)
            page.wait_for_selector("section.node")
            page.screenshot(path=str(args.out_dir / "dashboard-pool.png"))
            page.goto(url + "job/" + job["id"])
            page.wait_for_selector("table#explain tr.chosen")
            page.screenshot(path=str(args.out_dir / "dashboard-job.png"))
            browser.close()
        print(f"wrote dashboard-pool.png and dashboard-job.png in {args.out_dir}")
    finally:
        demo.wait(timeout=900)


if __name__ == "__main__":
    main()
