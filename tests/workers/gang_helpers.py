"""What the gang worker tests share: a pool of two 2-GPU H100 nodes in one rack, and a real
node worker for one of a pool's nodes (real processes, no NVML, history and log per node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.core.pool import Pool
from scheduler.service.store.redis_store import RedisStore
from workers.worker import NodeWorker

NODES: list[dict[str, Any]] = [
    {"name": "n1", "gpu": "H100-80GB", "count": 2, "rack": "r0"},
    {"name": "n2", "gpu": "H100-80GB", "count": 2, "rack": "r0"},
]
POOL = Pool.from_dict({"name": "two", "nodes": NODES})


def node_worker(
    store: RedisStore, tmp_path: Path, node: str, pool: Pool = POOL, **kw: Any
) -> NodeWorker:
    """A worker for ``node``; real processes unless ``simulate=True`` (then 1e-4 time scale)."""
    kw.setdefault("simulate", False)
    if not kw["simulate"]:
        kw.setdefault("nvml", None)
    else:
        kw.setdefault("time_scale", 1e-4)
    return NodeWorker(
        store,
        node,
        heartbeat_s=0.05,
        pool=pool,
        history_path=tmp_path / f"h-{node}.jsonl",
        log_path=tmp_path / f"log-{node}.jsonl",
        **kw,
    )
