"""An in-process simulated pool for the workflow tests: the leader and one simulated worker per
node of the demo pool, stepped in turn until no job is active (as in test_faults)."""

from __future__ import annotations

import time
from pathlib import Path

from scheduler.core.pool import Pool, load_pool
from scheduler.service.client import Client
from scheduler.service.leader import SchedulerService
from scheduler.service.store.redis_store import RedisStore

DEMO_POOL = Path(__file__).resolve().parents[3] / "datasets/pools/mixed.toml"


class SimPool:
    """``step()`` runs one scheduler step, then drains every node's queue with its worker."""

    def __init__(self, store: RedisStore, tmp_path: Path, pool: Pool | None = None) -> None:
        from workers.worker import NodeWorker

        self.store = store
        self.pool = pool or load_pool(DEMO_POOL)
        self.svc = SchedulerService(store, self.pool, simulated=True)
        self.workers = [
            NodeWorker(
                store,
                node.name,
                pool=self.pool,
                simulate=True,
                time_scale=1e-6,
                heartbeat_s=0.05,
                history_path=tmp_path / "history.jsonl",
            )
            for node in self.pool.nodes
        ]

    def step(self) -> None:
        from rq import SimpleWorker
        from rq.serializers import JSONSerializer

        from workers.execute import set_context

        self.svc.step()
        for w in self.workers:
            if not w.queue.count:
                continue
            set_context(w.ctx)
            SimpleWorker(
                [w.queue],
                connection=self.store.raw,
                serializer=JSONSerializer,
                job_class=w.rq_worker().job_class,
            ).work(burst=True, logging_level="ERROR")
        set_context(None)

    def run_until_idle(self, client: Client, timeout_s: float = 300.0) -> dict[str, int]:
        """Step until nothing is placeable, placed or running; the final counts per state.
        Held and dependency-blocked jobs stay pending outside ``P:pending``, so "idle" means
        the placement queue is empty and no job holds capacity."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.step()
            c = client.counts()
            if c["placed"] == c["running"] == 0 and not self.store.pending_window(1):
                return c
        raise AssertionError(f"pool still busy after {timeout_s} s: {client.counts()}")
