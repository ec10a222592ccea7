"""Starting snugfit commands as real processes for the dashboard tests, and reading the URL a
server prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
_URL = re.compile(r"(?:dashboard): (http://127\.0\.0\.1:\d+/)")


def start(args: list[str], url: str, home: Path, log: Path) -> subprocess.Popen[bytes]:
    """``snugfit ARGS`` on Redis ``url``, stdout and stderr to ``log``."""
    env = dict(os.environ, SNUGFIT_REDIS_URL=url, SNUGFIT_HOME=str(home), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-c", "from scheduler.cli import main; main()", *args],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def wait_for(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def served_url(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> str:
    """The dashboard URL ``proc`` printed to ``log`` (fails if it exits first)."""
    found: list[str] = []

    def printed() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}: {log.read_text()[-2000:]}")
        m = _URL.search(log.read_text(errors="replace"))
        if m:
            found.append(m.group(1))
        return bool(found)

    wait_for(printed, timeout, f"a dashboard URL in {log}")
    return found[0]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
