"""Sentinel failover with real processes: a master, one replica and three sentinels (real
``redis-server``s), a scheduler, a standby and two simulated workers on the ``redis+sentinel://``
URL, a stream of submissions, and SIGKILLs of the master (once in the default run; twice, the old
master back as a replica in between, behind ``-m slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler.cli.doctor import diagnose
from scheduler.core.pool import Pool
from scheduler.exceptions import ServiceError
from scheduler.service.client import Client
from scheduler.service.store.keys import TERMINAL_STATES
from scheduler.service.store.redis_store import RedisStore
from tests.jobs import inference_spec as spec
from tests.procs import stop_all
from tests.scheduler.service._sentinel_cluster import SentinelCluster, wait_for
from tests.scheduler.service.test_faults import TWO_NODES, check_capacity, write_pool

REPO = Path(__file__).resolve().parents[3]
#: The documented loss bound without SNUGFIT_DURABILITY=replica: what was acknowledged within the
#: replication lag before the kill; one second is generous on any LAN.
LOSS_WINDOW_S = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    c = SentinelCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _spawn(args: list[str], url: str, home: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SNUGFIT_REDIS_URL=url, SNUGFIT_HOME=str(home))
    env.pop("SNUGFIT_DURABILITY", None)  # only the submitting client asks for replica acks
    return subprocess.Popen(
        [sys.executable, "-c", "from scheduler.cli import main; main()", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


class _Submitter(threading.Thread):
    """Submits chunks of 3 jobs until stopped; a chunk that raised is retried with the same ids
    (idempotent), so every id ends either acknowledged or never acknowledged."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.acked: dict[str, float] = {}
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        client = Client(self.url)
        i = 0
        while not self.stop.is_set():
            specs = [spec(f"{i}-{k}") for k in range(3)]
            try:
                handles = client.submit_many(specs)
            except (redis.RedisError, OSError, ServiceError):
                self.errors += 1
                time.sleep(0.1)
                continue
            now = time.time()
            self.acked.update({h.id: now for h in handles})
            i += 1
            time.sleep(0.25)  # a steady stream, small enough to drain quickly on a loaded box


def _first_placement_after(store: RedisStore, t_kill: float) -> float:
    """Seconds from the kill to the first ``placed`` event written after it (stream ids are the
    server's clock in ms; every process runs on this machine)."""
    for eid, e in store.events(after=f"{int(t_kill * 1000)}-0", count=10_000):
        if e.get("event") == "placed":
            return int(eid.split("-")[0]) / 1000 - t_kill
    return 0.0


def _failover(
    cluster: SentinelCluster, store: RedisStore, sub: _Submitter, old: str
) -> tuple[str, float]:
    """SIGKILL the master ``old``; return the new master and the seconds to its first placement."""
    t_kill = time.time()
    cluster.kill(old)
    new = cluster.wait_promoted(old)
    # The old master comes back as a replica of the new one (what the sentinels would make it);
    # until it has synced, a replica-durable submit is refused (no replica to confirm it).
    cluster.start_data(old, replica_of=cluster.data_ports[new])
    cluster.wait_replica_synced(cluster.data_ports[new], timeout=60)
    n = len(sub.acked)
    wait_for(lambda: len(sub.acked) >= n + 6, 60, "submissions acknowledged by the new master")
    took = wait_for(lambda: _first_placement_after(store, t_kill), 60, "a placement after the kill")
    return new, float(took)


def _run(tmp_path: Path, cluster: SentinelCluster, n_failovers: int) -> dict[str, Any]:
    pool_file = write_pool(tmp_path, TWO_NODES)
    home = tmp_path / "home"
    url = cluster.url
    procs: list[subprocess.Popen[bytes]] = []
    sched = ["scheduler", "--pool", str(pool_file), "--simulated", "--lease-ttl", "2"]
    sub = _Submitter(url)
    try:
        for k in range(2):
            procs.append(_spawn(sched, url, home, tmp_path / f"scheduler{k}.log"))
        for node in ("n1", "n2"):
            args = ["worker", "--node", node, "--pool", str(pool_file), "--simulate"]
            args += ["--time-scale", "0.002", "--heartbeat", "0.1"]
            procs.append(_spawn(args, url, home, tmp_path / f"worker-{node}.log"))
        store = Client(url).store
        assert isinstance(store, RedisStore)
        sub.start()
        wait_for(lambda: store.count("succeeded") >= 6, 90, "jobs to succeed before the fault")
        master, to_first_placement, kills = cluster.master_name(), [], []
        for _ in range(n_failovers):
            kills.append(time.time())
            master, took = _failover(cluster, store, sub, master)
            to_first_placement.append(took)
        n = len(sub.acked)
        wait_for(lambda: len(sub.acked) >= n + 6, 60, "submissions after the last failover")
    finally:
        sub.stop.set()
        sub.join(timeout=30)
    try:
        acked = dict(sub.acked)
        present = set(store.job_ids())
        lost = sorted(j for j in acked if j not in present)

        def settled() -> bool:
            rows = store.get_fields(sorted(present), ["state"])
            return all(r[0] in TERMINAL_STATES for r in rows)

        wait_for(settled, 120, f"every job to finish (counts {Client(url).counts()})")
        states = dict(
            zip(
                sorted(present),
                (r[0] for r in store.get_fields(sorted(present), ["state"])),
                strict=True,
            )
        )
        alive = [p.poll() is None for p in procs]
        # No job placed twice for one attempt, and no two attempts of a job started at once.
        placed: dict[tuple[str, int], int] = defaultdict(int)
        for _, e in store.events(count=100_000):
            if e.get("event") == "placed":
                placed[(str(e.get("job_id")), int(e.get("attempt") or 0))] += 1
        wait_for(lambda: store.alloc_ids() == [], 30, "capacity to come back")
        check_capacity(store, Pool.from_dict(TWO_NODES))
        doctor = diagnose(url)  # `snugfit doctor` sees the whole deployment after the failovers
        assert [s["up"] for s in doctor["sentinels"]] == [True] * 3
        assert len(doctor["replicas"]) == 1 and doctor["master"]["role"] == "master"
        assert {q["name"] for q in doctor["rq_queues"]} >= {"snugfit:node:n1", "snugfit:node:n2"}
    finally:
        stop_all(procs)
    result = {
        "acknowledged": len(acked),
        "lost": lost,
        "lost_outside_window": [
            j for j in lost if not any(0 <= k - acked[j] <= LOSS_WINDOW_S for k in kills)
        ],
        "not_succeeded": sorted(j for j in acked if j in states and states[j] != "succeeded"),
        "double_placed": sorted(k for k, v in placed.items() if v > 1),
        "alive": alive,
        "submit_errors": sub.errors,
        "kill_to_first_placement_s": [round(t, 2) for t in to_first_placement],
    }
    print("failover result:", json.dumps(result))
    return result


def _check(result: dict[str, Any], durable: bool) -> None:
    assert all(result["alive"]), f"a process died: {result['alive']}"
    assert not result["double_placed"], result["double_placed"]
    assert all(t <= 30 for t in result["kill_to_first_placement_s"]), result
    if durable:
        assert not result["lost"], f"acknowledged jobs lost: {result['lost'][:5]}"
        assert not result["not_succeeded"], result["not_succeeded"][:5]
    else:
        assert not result["lost_outside_window"], result


def test_single_failover_durable_loses_nothing(
    tmp_path: Path, cluster: SentinelCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNUGFIT_DURABILITY", "replica")
    _check(_run(tmp_path, cluster, n_failovers=1), durable=True)


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["replica", "local"])
def test_two_failovers(
    tmp_path: Path, cluster: SentinelCluster, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    monkeypatch.setenv("SNUGFIT_DURABILITY", durability)
    _check(_run(tmp_path, cluster, n_failovers=2), durable=durability == "replica")
