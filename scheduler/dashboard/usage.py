"""Cost and GPU-hours over time, from the placement log.

Each attempt is billed when it ends (``finished`` or ``oom``, or ``cancelled``/``reclaimed``
after it started), as the demo's live metrics bill it: the chosen option's predicted cost
scaled by how long it really held the slot, ``cost_usd * held / runtime_s``, and GPU-hours as
that cost over the type's price per GPU-hour (so a MIG slice or a share counts as the part of
a GPU it was priced as). ``held`` is the measured ``outcome.runtime_s`` (workload seconds, also
for simulated runs); an attempt that ended without an outcome (a reclaimed lease) is billed for
its wall-clock time from ``started`` to its end event. OOM-killed attempts are billed too: the
slot was held.

:class:`UsageTail` reads the stream incrementally (from where the last call stopped), so a
page that refreshes every few seconds costs one short ``XRANGE`` per refresh.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.pool import Pool
from scheduler.exceptions import SchedulerError

__all__ = ["BilledAttempt", "UsageTail", "usage_series"]

_CHUNK = 5000
# Attempts remembered between their placement and their end (running jobs, with headroom).
_MAX_OPEN = 200_000
_ENDS = ("finished", "oom", "cancelled", "reclaimed")


@dataclass(frozen=True, slots=True)
class BilledAttempt:
    job_id: str
    attempt: int
    ended_at: float  # epoch seconds of the end event
    gpu_type: str
    cost_usd: float
    gpu_hours: float
    simulated: bool


@dataclass(slots=True)
class _Open:
    option: dict[str, Any]
    started_at: float | None = None


class UsageTail:
    """Billed attempts of the placement log, read incrementally; thread-safe."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._after = "0"
        self._open: OrderedDict[tuple[str, int], _Open] = OrderedDict()
        self._billed: list[BilledAttempt] = []
        self._prices: dict[str, float] = {}
        self._lock = threading.Lock()

    def poll(self) -> list[BilledAttempt]:
        """Ingest what was appended since the last call; returns every billed attempt so far,
        in end order."""
        with self._lock:
            self._load_prices()
            while True:
                page = self.store.events(after=self._after, count=_CHUNK)
                for eid, event in page:
                    self._after = eid
                    self._ingest(event)
                if len(page) < _CHUNK:
                    break
            return list(self._billed)

    def _load_prices(self) -> None:
        config = self.store.pool_config()
        if config is None:
            return
        try:
            pool = Pool.from_dict(config)
        except SchedulerError:
            return
        self._prices = {t: pool.price_for(t) for t in pool.types_present()}

    def _ingest(self, e: Mapping[str, Any]) -> None:
        kind = e.get("event")
        jid, att = e.get("job_id"), e.get("attempt")
        if not isinstance(jid, str) or not isinstance(att, int):
            return
        key = (jid, att)
        if kind == "placed" and isinstance(e.get("option"), dict):
            self._open[key] = _Open(dict(e["option"]))
            if len(self._open) > _MAX_OPEN:
                self._open.popitem(last=False)
            return
        got = self._open.get(key)
        if got is None:
            return
        ts = _num(e.get("ts"))
        if kind == "started":
            got.started_at = ts
            return
        if kind not in _ENDS or ts is None:
            return
        out = e.get("outcome") if isinstance(e.get("outcome"), dict) else None
        held = _num(out.get("runtime_s")) if out else None
        if held is None and got.started_at is not None:
            held = max(ts - got.started_at, 0.0)
        del self._open[key]
        if held is None:
            return  # cancelled or reclaimed before it started: nothing was held
        o = got.option
        rt, cost = _num(o.get("runtime_s")), _num(o.get("cost_usd"))
        if rt is None or rt <= 0 or cost is None:
            return
        billed = cost * held / rt
        gpu_type = str(o.get("gpu_type"))
        price = self._prices.get(gpu_type)
        sim = bool(e.get("simulated") or (out and out.get("simulated")))
        bisect.insort(
            self._billed,
            BilledAttempt(jid, att, ts, gpu_type, billed, billed / price if price else 0.0, sim),
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
            "cost_usd": round(sum(b.cost_usd for b in billed), 6),
            "gpu_hours": round(sum(b.gpu_hours for b in billed), 6),
            "attempts": len(billed),
            "cost_by_type": {
                t: round(sum(b.cost_usd for b in billed if b.gpu_type == t), 6) for t in types
            },
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
        out["cost_usd"].append(round(cost, 6))
        out["gpu_hours"].append(round(hours, 6))
        for t in types:
            out["cost_by_type"][t].append(round(by_type[t], 6))
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
