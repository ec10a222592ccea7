"""MPS on a shared node, with a fake ``nvidia-cuda-mps-control`` on PATH: one daemon per GPU
with its pipe and log directories under $SNUGFIT_HOME, each client's memory limit and compute
share, and a node that refuses work when a daemon cannot start."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from scheduler.core.pool import Pool
from scheduler.core.shares import shared_compute_share
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from workers.mps import MpsDaemons, thread_percentage
from workers.nvml import FakeGpu, FakeNvml
from workers.worker import NodeWorker

POOL = Pool.from_dict(
    {
        "name": "shared",
        "nodes": [
            {"name": "n1", "gpu": "H100-80GB", "count": 2, "mode": "shared", "max_shared_jobs": 4}
        ],
    }
)
DUMP = "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"

# The fake daemon: `-d` creates the control pipe (or fails when FAKE_MPS_FAIL is set); a
# command on stdin is answered while the pipe exists. Every call is logged with its env.
FAKE = """#!{python}
import json, os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "stdin": "" if "-d" in sys.argv else
        sys.stdin.read().strip(), "CVD": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pipe": pipe, "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
control = os.path.join(pipe, "control")
if "-d" in sys.argv:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("mps: Insufficient permissions to start the daemon", file=sys.stderr)
        sys.exit(1)
    open(control, "w").close()
    sys.exit(0)
if not os.path.exists(control):
    sys.exit(1)
with open(os.path.join(os.path.dirname(__file__), "calls.jsonl")) as fh:
    last = [json.loads(x) for x in fh][-1]
if last["stdin"] == "quit":
    os.unlink(control)
else:
    print(100)
"""


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "calls.jsonl"


def calls(log: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def nvml() -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=f"GPU-0000000{i}-0000-0000-0000-000000000000") for i in (0, 1)])


def test_daemons_start_per_gpu_and_clients_get_their_limits(
    store: RedisStore, tmp_path: Path, fake_mps: Path
) -> None:
    home = tmp_path / "home"
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", DUMP]))
    SchedulerService(store, POOL).step()
    p = h.placement
    assert p is not None and p.kind == "shared"
    w = NodeWorker(store, "n1", pool=POOL, nvml=nvml(), heartbeat_s=0.05, home=home)
    w.work(burst=True)
    assert h.status() == "succeeded", h.reason
    started = [c for c in calls(fake_mps) if c["argv"] == ["-d"]]
    assert sorted(c["CVD"] for c in started) == [
        f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in (0, 1)
    ]
    for k, c in enumerate(sorted(started, key=lambda c: c["pipe"])):
        assert c["pipe"] == str(home / "mps" / f"gpu{k}" / "pipe")
        assert c["log"] == str(home / "mps" / f"gpu{k}" / "log")
    env = json.loads(next(x for x in h.logs().splitlines() if x.startswith("ENV="))[4:])
    k = p.gpu_indices[0]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(home / "mps" / f"gpu{k}" / "pipe")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={int(p.reserved_gib * 1024 + 0.999)}M"
    share = shared_compute_share(p.reserved_gib, p.capacity_gib, 4)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(thread_percentage(share))
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    # The daemons this worker started are asked to quit when it stops.
    assert sum(c["stdin"] == "quit" for c in calls(fake_mps)) == 2
    assert store.nodes()["n1"]["refuse"] == ""


def test_a_running_daemon_is_verified_not_started_again(tmp_path: Path, fake_mps: Path) -> None:
    d = MpsDaemons(tmp_path, [0])
    assert d.ensure() == [] and d.started == [0]
    again = MpsDaemons(tmp_path, [0])
    assert again.ensure() == [] and again.started == []  # found running: not ours to stop
    assert [c["argv"] for c in calls(fake_mps)].count(["-d"]) == 1


def test_node_refuses_shared_work_when_mps_cannot_start(
    store: RedisStore, tmp_path: Path, fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    h = Client(store=store).submit(spec(0, [sys.executable, "-c", DUMP]))
    svc = SchedulerService(store, POOL)
    svc.node_watch.check_s = 0.0
    w = NodeWorker(store, "n1", pool=POOL, nvml=nvml(), heartbeat_s=0.05, home=tmp_path)
    assert w.work(burst=True) is False
    refuse = store.nodes()["n1"]["refuse"]
    assert "MPS on GPU 0" in refuse and "Insufficient permissions" in refuse, refuse
    svc.step()
    assert h.status() == "pending"  # the scheduler reads the refusal: nothing placed there


def test_node_refuses_when_the_mps_binary_is_missing(store: RedisStore, tmp_path: Path) -> None:
    d = MpsDaemons(tmp_path, [0], binary="nvidia-cuda-mps-control-not-installed")
    (problem,) = d.ensure()
    assert "not on PATH" in problem


def test_thread_percentage_rounds_up_within_1_to_100() -> None:
    assert [thread_percentage(x) for x in (0.0, 0.001, 0.25, 0.251, 1.0, 3.0)] == [
        1,
        1,
        25,
        26,
        100,
        100,
    ]


def test_a_refusing_node_takes_work_again_once_mps_can_start(
    store: RedisStore, tmp_path: Path, fake_mps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    w = NodeWorker(store, "n1", pool=POOL, nvml=nvml(), heartbeat_s=0.05, home=tmp_path)
    w.recheck_s = 0.0
    w.refused = w.refusals()
    w.register()
    assert store.nodes()["n1"]["refuse"]
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(w._wait_until_fixed(burst=False)))
    t.start()
    monkeypatch.delenv("FAKE_MPS_FAIL")  # the operator fixed the daemon's permissions
    t.join(30)
    assert got == [True]
    assert store.nodes()["n1"]["refuse"] == ""
    w.ctx.mps.stop()
