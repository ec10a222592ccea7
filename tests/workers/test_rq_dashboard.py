"""README's rq-dashboard command, run as written against a real worker running a real job.

rq-dashboard is not a dependency (it pins its own Flask stack): the test runs when an
``rq-dashboard`` executable is on PATH or named by ``RQ_DASHBOARD`` (e.g. a throwaway venv:
``python3 -m venv /tmp/rqd && /tmp/rqd/bin/pip install rq-dashboard six``), and skips otherwise.
Without ``--json`` the dashboard unpickles snugfit's JSON job payloads and every job page
answers HTTP 500 (``UnpicklingError: invalid load key, '{'``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.keys import queue_name, rq_job_id
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import wait_for
from tests.scheduler.service.test_faults import snugfit, write_pool
from tests.workers.test_rq_registries import POOL, _waits_for

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_command() -> list[str]:
    """The rq-dashboard command line README gives, split as a shell would."""
    m = re.search(r"`(rq-dashboard [^`]+)`", README.read_text(encoding="utf-8"))
    assert m is not None, "README names no rq-dashboard command"
    return shlex.split(m.group(1))


def test_readme_command_asks_for_the_json_serializer() -> None:
    # The workers' queues hold JSON payloads; rq-dashboard reads pickle unless told.
    assert "--json" in readme_command()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def test_readme_dashboard_command_shows_a_running_job(
    tmp_path: Path,
    redis_url: str,
    procs: list[Any],
) -> None:
    exe = os.environ.get("RQ_DASHBOARD") or shutil.which("rq-dashboard")
    if not exe:
        pytest.skip("rq-dashboard is not installed (set RQ_DASHBOARD to its executable)")
    conn = redis.Redis.from_url(redis_url)
    store = RedisStore(conn)
    go = tmp_path / "go"
    h = Client(store=store).submit(spec("dash", _waits_for(go, 0)))
    SchedulerService(store, Pool.from_dict(POOL)).step()
    args = ["worker", "--node", "n1", "--pool", str(write_pool(tmp_path, POOL))]
    procs.append(snugfit([*args, "--heartbeat", "0.1"], redis_url, tmp_path / "home"))
    wait_for(lambda: h.status() == "running", 60, "the job to run")

    port = _free_port()
    argv = [exe, *readme_command()[1:], "--bind", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, SNUGFIT_REDIS_URL=redis_url)
    argv = [a.replace("$SNUGFIT_REDIS_URL", redis_url) for a in argv]  # as the shell would
    dash = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    procs.append(dash)
    base = f"http://127.0.0.1:{port}/0"
    wait_for(lambda: _get(f"{base}/data/queues.json")[0] == 200, 60, "rq-dashboard to answer")
    rq_id = rq_job_id(h.id, 1)
    code, _ = _get(f"{base}/view/job/{rq_id}")
    assert code == 200
    code, body = _get(f"{base}/data/job/{rq_id}.json")
    assert code == 200 and json.loads(body)["status"] == "started"
    code, body = _get(f"{base}/data/workers.json")
    assert code == 200 and [w["state"] for w in json.loads(body)["workers"]] == ["busy"]
    listing = f"{base}/data/jobs/{queue_name('n1')}/started/8/asc/1.json"
    code, body = _get(listing)
    assert code == 200 and [j["id"] for j in json.loads(body)["jobs"]] == [rq_id]

    go.touch()
    wait_for(lambda: h.status() == "succeeded", 60, "the job to end")
    done = lambda: json.loads(_get(f"{base}/data/job/{rq_id}.json")[1])["status"]  # noqa: E731
    wait_for(lambda: done() == "finished", 30, "the dashboard to show it finished")
