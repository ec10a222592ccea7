"""Node liveness and operator state: stale nodes get nothing new, their unstarted jobs move
elsewhere without using a retry; cordon / drain / uncordon; a worker for an unknown node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from scheduler.cli import cli
from scheduler.core.pool import Pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.nodes import node_statuses
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import Procs, wait_for
from tests.scheduler.service.test_faults import snugfit, write_pool

REPO = Path(__file__).resolve().parents[3]
# "cheap" is cheaper for the test job, so placement picks it whenever it is open.
POOL = {
    "name": "two",
    "nodes": [
        {"name": "cheap", "gpu": "A100-80GB", "count": 2},
        {"name": "dear", "gpu": "H200-141GB", "count": 2},
    ],
}


def _beat(store: RedisStore, node: str, age_s: float = 0.0) -> None:
    store.register_node(node, {"worker": f"w-{node}", "heartbeat_at": repr(time.time() - age_s)})


def _service(store: RedisStore, **kw: Any) -> SchedulerService:
    kw.setdefault("node_stale_s", 2.0)
    return SchedulerService(store, Pool.from_dict(POOL), node_check_s=0.0, **kw)


def test_node_statuses_pure() -> None:
    now = 1000.0
    reg = {"up": {"heartbeat_at": "999"}, "old": {"heartbeat_at": "900"}, "bad": {"x": "1"}}
    st = node_statuses(
        ["up", "old", "bad", "new", "cord"],
        reg | {"cord": {"heartbeat_at": "999"}},
        {"cord": "cordoned", "up": "garbage"},
        now=now,
        stale_s=15,
    )
    assert st["up"].schedulable and st["up"].liveness == "up" and st["up"].admin is None
    assert st["old"].liveness == "down" and not st["old"].schedulable and st["old"].evacuate
    assert "100 s ago" in st["old"].reason and "snugfit worker --node old" in st["old"].reason
    assert st["bad"].liveness == "down"  # registered, but no readable heartbeat
    assert st["new"].liveness == "unknown" and st["new"].schedulable
    assert st["cord"].liveness == "up" and not st["cord"].schedulable
    assert not st["cord"].evacuate and "uncordon cord" in st["cord"].reason
    off = node_statuses(["old"], reg, {}, now=now, stale_s=None)
    assert off["old"].schedulable


def test_stale_node_gets_nothing_and_its_job_moves_without_a_retry(store: RedisStore) -> None:
    client = Client(store=store)
    svc = _service(store, node_stale_s=30.0)
    h = client.submit(spec(0))
    _beat(store, "cheap")
    _beat(store, "dear")
    assert svc.step().placed == 1
    assert h.placement is not None and h.placement.node == "cheap"
    _beat(store, "cheap", age_s=60.0)  # the cheap node's worker stopped beating
    _beat(store, "dear")
    s = svc.step()  # moved back to pending and placed again in the same step
    assert s.moved == 1 and s.placed == 1
    assert "no retry used" in " ".join(e.get("reason", "") for _, e in store.events())
    assert h.status() == "placed" and h.placement is not None and h.placement.node == "dear"
    rec = h.record()
    assert rec.get("lost") in (None, "0") and rec.get("moved") == "1"
    # New jobs go elsewhere while the node stays down, or wait (the other node has 2 GPUs).
    more = client.submit_many([spec(i) for i in range(1, 3)])
    for _ in range(3):
        svc.step()
    assert [m.status() for m in more] == ["placed", "pending"]
    placed_nodes = [e["node"] for _, e in store.events() if e["event"] == "placed"]
    assert placed_nodes == ["cheap", "dear", "dear"]  # none on cheap after it went stale
    # It comes back: placements resume there.
    _beat(store, "cheap")
    svc.step()
    assert more[1].placement is not None and more[1].placement.node == "cheap"
    svc.assert_consistent()


def test_cordon_drain_uncordon(store: RedisStore, redis_url: str) -> None:
    client = Client(store=store)
    svc = _service(store, node_stale_s=None)
    svc.step()  # publishes the pool
    runner = CliRunner()

    def node(*args: str) -> Any:
        return runner.invoke(cli, ["node", *args, "--redis", redis_url])

    out = node("cordon", "nope")
    assert out.exit_code != 0 and "cheap, dear" in out.output
    h = client.submit(spec(0))
    svc.step()
    assert h.placement is not None and h.placement.node == "cheap"
    assert node("cordon", "cheap").exit_code == 0
    svc.step()
    assert h.status() == "placed"  # cordon leaves what is there
    h1 = client.submit(spec(1))
    svc.step()
    assert h1.placement is not None and h1.placement.node == "dear"
    pool_out = runner.invoke(cli, ["pool", "--redis", redis_url, "--width", "200"]).output
    assert "cordoned" in pool_out
    assert node("drain", "cheap").exit_code == 0
    s = svc.step()
    assert s.moved == 1
    assert h.placement is not None and h.placement.node == "dear" and h.placement.attempt == 2
    assert h.record().get("lost") in (None, "0")
    pool_out = runner.invoke(cli, ["pool", "--redis", redis_url, "--width", "200"]).output
    assert "drained" in pool_out
    assert node("uncordon", "cheap").exit_code == 0
    h2 = client.submit(spec(2))
    svc.step()
    assert h2.placement is not None and h2.placement.node == "cheap"
    svc.assert_consistent()


def test_worker_for_a_node_not_in_the_pool_exits_at_once(tmp_path: Path, redis_url: str) -> None:
    pool_file = write_pool(tmp_path, POOL)
    env = dict(os.environ, SNUGFIT_REDIS_URL=redis_url, SNUGFIT_HOME=str(tmp_path))
    t0 = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from scheduler.cli import main; main()",
            "worker",
            "--node",
            "chepa",
            "--pool",
            str(pool_file),
            "--simulate",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "'chepa' is not in pool 'two'" in out.stderr and "cheap, dear" in out.stderr
    assert time.monotonic() - t0 < 30


def test_sigstopped_worker_its_queued_job_runs_elsewhere_with_no_retry_used(
    tmp_path: Path, redis_url: str, store: RedisStore, procs: Procs
) -> None:
    """Real worker processes: the cheap node's worker is frozen (SIGSTOP: no heartbeat, its
    queue unread) right after a job is placed there; the job runs on the other node."""
    pool_file = write_pool(tmp_path, POOL)
    client = Client(store=store)
    svc = _service(store, node_stale_s=3.0)
    svc.step()
    home = tmp_path / "home"
    workers = {}
    for node in ("cheap", "dear"):
        args = ["worker", "--node", node, "--pool", str(pool_file), "--simulate"]
        args += ["--time-scale", "0.001", "--heartbeat", "0.1", "--node-heartbeat", "0.2"]
        workers[node] = snugfit(args, redis_url, home)
        procs.append(workers[node])
    wait_for(lambda: set(store.nodes()) == {"cheap", "dear"}, 60, "both workers to register")
    wait_for(lambda: (svc.step(), not svc.node_watch.closed)[1], 30, "both nodes up")
    h = client.submit(spec(0))  # before the freeze: a slow submit must not outlast the window
    workers["cheap"].send_signal(signal.SIGSTOP)
    try:
        svc.step()
        assert h.placement is not None and h.placement.node == "cheap"
        t0 = time.monotonic()

        def done() -> bool:
            svc.step()
            return h.status() == "succeeded"

        wait_for(done, 30, "the job to run on the other node")
        moved_s = time.monotonic() - t0
        assert h.placement is not None and h.placement.node == "dear"
        rec = h.record()
        assert rec.get("lost") in (None, "0") and rec.get("moved") == "1", rec
        assert moved_s < 3.0 + 0.2 + 10  # stale window + check + worker pick-up, with slack
        print(f"queued on a frozen node: ran elsewhere {moved_s:.2f} s after its placement")
        later = client.submit_many([spec(i) for i in range(1, 5)])
        wait_for(lambda: (svc.step(), all(x.status() == "succeeded" for x in later))[1], 30, "x")
        assert {x.placement.node for x in later if x.placement} == {"dear"}
    finally:
        workers["cheap"].send_signal(signal.SIGCONT)
    # The thawed worker finds attempt 1 in its queue: stale, so it is skipped, not run twice.
    wait_for(
        lambda: (svc.step(), "cheap" not in svc.node_watch.closed)[1], 30, "cheap to beat again"
    )
    started = [e for _, e in store.events() if e["event"] == "started" and e["job_id"] == h.id]
    assert [e["node"] for e in started] == ["dear"]
