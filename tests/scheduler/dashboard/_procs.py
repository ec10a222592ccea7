"""Starting snugfit commands as real processes for the dashboard tests, and reading the URL a
server prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.procs import wait_for

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
