"""Cost and GPU-hours over time, from the placement log.

Each attempt is charged when its end event (``finished``, ``oom``, ``cancelled`` or a user's
``requeued``) carries a measured runtime, with the definitions ``snugfit acct`` uses:

- cost = the placement's predicted cost x measured runtime / predicted runtime: the option's
  price per second, as the scheduler priced it, for as long as the attempt held it;
- GPU-hours = GPUs held x measured hours, where a MIG slice counts as its share of the GPU's
  memory and an MPS share as its reservation's share of the GPU.

The runtime is ``outcome.runtime_s``: workload seconds, also for time-scaled simulated runs.
OOM-killed attempts are charged (the slot was held); an attempt that ended without a measured
outcome (a lost lease) is not.

:class:`UsageTail` reads the stream incrementally (from where the last call stopped), so a
page that refreshes every few seconds costs one short ``XRANGE`` per refresh.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cli.ops import number
from scheduler.service.accounting import gpu_share

__all__ = ["BilledAttempt", "UsageTail", "usage_series"]

_CHUNK = 5000
# Attempts remembered between their placement and their end (running jobs, with headroom).
_MAX_OPEN = 200_000
_ENDS = ("finished", "oom", "cancelled", "requeued")


@dataclass(frozen=True, slots=True)
class BilledAttempt:
    job_id: str
    attempt: int
    ended_at: float  # epoch seconds of the end event
    gpu_type: str
    cost_usd: float
    gpu_hours: float
    simulated: bool


class UsageTail:
    """Billed attempts of the placement log, read incrementally; thread-safe."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._after = "0"
        self._open: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._billed: list[BilledAttempt] = []
        self._lock = threading.Lock()

    def poll(self) -> list[BilledAttempt]:
        """Ingest what was appended since the last call; returns every billed attempt so far,
        in end order."""
        with self._lock:
            while True:
                page = self.store.events(after=self._after, count=_CHUNK)
                for eid, event in page:
                    self._after = eid
                    self._ingest(event)
                if len(page) < _CHUNK:
                    break
            return list(self._billed)

    def _ingest(self, e: Mapping[str, Any]) -> None:
        kind = e.get("event")
        jid, att = e.get("job_id"), e.get("attempt")
        if not isinstance(jid, str) or not isinstance(att, int):
            return
        key = (jid, att)
        if kind == "placed" and isinstance(e.get("option"), dict):
            self._open[key] = dict(e["option"])
            if len(self._open) > _MAX_OPEN:
                self._open.popitem(last=False)
            return
        if kind == "reclaimed":  # a lost lease: the attempt is over, with nothing measured
            self._open.pop(key, None)
            return
        o = self._open.get(key)
        ts = number(e.get("ts"))
        if o is None or kind not in _ENDS or ts is None:
            return
        out = e.get("outcome") if isinstance(e.get("outcome"), dict) else None
        held = number(out.get("runtime_s")) if out else None
        if kind in ("finished", "oom") or held is not None:
            del self._open[key]
        if held is None:
            return  # no measured outcome (a lost lease, a cancel before it started)
        rt, cost = number(o.get("runtime_s")), number(o.get("cost_usd"))
        if cost is None or rt is None:
            return
        billed = cost * held / rt if rt > 0 else 0.0
        sim = bool(e.get("simulated") or (out and out.get("simulated")))
        bisect.insort(
            self._billed,
            BilledAttempt(
                jid, att, ts, str(o.get("gpu_type")), billed, gpu_share(o) * held / 3600, sim
            ),
            key=lambda b: b.ended_at,
        )


def usage_series(billed: list[BilledAttempt], *, max_points: int = 240) -> dict[str, Any]:
    """Cumulative cost (total and per GPU type) and GPU-hours at up to ``max_points`` times."""
    types = sorted({b.gpu_type for b in billed})
    out: dict[str, Any] = {
        "t": [],
        "cost_usd": [],
        "gpu_hours": [],
        "cost_by_type": {t: [] for t in types},
        "totals": {
            "cost_usd": sum(b.cost_usd for b in billed),
            "gpu_hours": sum(b.gpu_hours for b in billed),
            "attempts": len(billed),
            "cost_by_type": {t: sum(b.cost_usd for b in billed if b.gpu_type == t) for t in types},
        },
        "simulated": any(b.simulated for b in billed),
    }
    if not billed:
        return out
    t0, t1 = billed[0].ended_at, billed[-1].ended_at
    n = max(1, min(max_points, len(billed)))
    edges = [t1] if n == 1 or t1 <= t0 else [t0 + (t1 - t0) * (k + 1) / n for k in range(n)]
    edges[-1] = t1  # the last point holds every attempt, whatever the rounding above
    cost = hours = 0.0
    by_type = dict.fromkeys(types, 0.0)
    k = 0
    for edge in edges:
        while k < len(billed) and billed[k].ended_at <= edge:
            b = billed[k]
            cost += b.cost_usd
            hours += b.gpu_hours
            by_type[b.gpu_type] += b.cost_usd
            k += 1
        out["t"].append(edge)
        out["cost_usd"].append(cost)
        out["gpu_hours"].append(hours)
        for t in types:
            out["cost_by_type"][t].append(by_type[t])
    return out
