"""The commit tests' independent check of the capacity ledger: ``P:gpu`` in Redis holds exactly
what the allocation records add up to, per GPU (reserved MiB, shared jobs) and per node (CPU
millicores, host MiB, each within its capacity)."""

from __future__ import annotations

import json
from collections import Counter

from scheduler.service.store.redis_store import RedisStore

__all__ = ["assert_ledger_matches_allocations"]

_SHARED = 2  # the allocation record's ``kind`` code of a shared-GPU slot


def assert_ledger_matches_allocations(store: RedisStore) -> None:
    """Sum every allocation record and compare each ``P:gpu`` counter with its sum."""
    g = store.gpu_state()
    want: Counter[str] = Counter()
    for raw in store.allocations().values():
        a = json.loads(raw)
        for gi in a["gpus"]:
            want[f"{gi}:used"] += a["used_mib"]
            want[f"{gi}:shared"] += a["kind"] == _SHARED
        node = g[f"{a['gpus'][0]}:node"]
        want[f"n{node}:cpu"] += a.get("cpu_milli", 0)
        want[f"n{node}:host"] += a.get("host_mib", 0)
    counters = [k for k in g if k.endswith((":used", ":shared", ":cpu", ":host"))]
    assert {k: g[k] for k in counters} == {k: want[k] for k in counters}
    for k in (k for k in g if k.endswith(":cpu_cap")):
        node = k.removesuffix(":cpu_cap")
        assert g[f"{node}:cpu"] <= g[k] and g[f"{node}:host"] <= g[f"{node}:host_cap"]
