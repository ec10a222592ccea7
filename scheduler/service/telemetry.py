"""Prometheus metrics of the scheduler service (prometheus-client), served over HTTP.

Most series are derived from Redis itself, so they are right even when the service restarts or
several processes write events:

- ``snugfit_jobs{state}``: queue depth per job state, read (SCARD) at every scrape;
- ``snugfit_placements_total{gpu_type,kind,policy}``, ``snugfit_oom_kills_total{gpu_type}``,
  ``snugfit_reclaimed_leases_total``, ``snugfit_events_total{event}`` and the prediction-error
  histograms ``snugfit_prediction_vram_ratio{gpu_type}`` /
  ``snugfit_prediction_runtime_ratio{gpu_type}`` (measured / predicted): counted from the
  placement log ``P:events``, tailed at each scrape from where the last one stopped. The stream
  is read from its start, so the counters cover its whole retained history.

- ``snugfit_user_placements_total{user,team}``, ``snugfit_user_gpu_hours_total{user,team}``
  and ``snugfit_user_cost_usd_total{user,team}``: the same log, labelled with the job record's
  ``user`` and ``team``; the first 50 users and 20 teams seen keep their names and the rest
  count as ``other`` (``max_users`` / ``max_teams``), so the series stay bounded.

Only the placement latency cannot be read back from Redis: the service times each placement and
calls :meth:`Telemetry.observe_placement_latency` (``snugfit_placement_latency_seconds``).

Each :class:`Telemetry` owns its registry (no process-global state), so tests and several
services in one process do not collide.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.service._user_metrics import DEFAULT_MAX_TEAMS, DEFAULT_MAX_USERS, UserMetrics
from scheduler.service.accounting import END_EVENTS
from scheduler.service.store.keys import EVENT_KINDS, JobState, Keys

__all__ = [
    "DEFAULT_METRICS_HOST",
    "LATENCY_BUCKETS_SECONDS",
    "RATIO_BUCKETS",
    "Telemetry",
    "start_metrics_server",
]

#: Loopback by default: queue depths and job counts are not for the whole network; an operator
#: who scrapes from elsewhere says so (``snugfit scheduler --metrics-host 0.0.0.0``).
DEFAULT_METRICS_HOST = "127.0.0.1"

# Placement is meant to take milliseconds (p99 <= 50 ms goal), so the buckets resolve that range.
LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
# measured / predicted: 1.0 is a perfect prediction; > 1 under-predicted (OOM risk).
RATIO_BUCKETS: tuple[float, ...] = (
    0.25,
    0.5,
    0.7,
    0.8,
    0.9,
    0.95,
    1.0,
    1.05,
    1.1,
    1.25,
    1.5,
    2.0,
    4.0,
)
# A first scrape after a long history reads the stream in chunks of this many entries.
_XRANGE_CHUNK = 5000
# Placements remembered until their attempt ends (running jobs at once, with ample headroom).
_MAX_REMEMBERED_PLACEMENTS = 200_000


class _RedisCollector(Collector):
    """Reads queue depth and tails the event stream on every scrape."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._t = telemetry

    def collect(self) -> Iterable[Metric]:
        t = self._t
        gauge = GaugeMetricFamily(
            "snugfit_jobs", "Jobs in each state (queue depth per state).", labels=["state"]
        )
        up = 1.0
        try:
            t.poll_events()
            for state, n in t.queue_depth().items():
                gauge.add_metric([state], float(n))
        except Exception:  # a scrape must answer even while Redis is down
            up = 0.0
        yield gauge
        redis_up = GaugeMetricFamily(
            "snugfit_redis_up", "1 when the last scrape could read Redis, else 0."
        )
        redis_up.add_metric([], up)
        yield redis_up

    def describe(self) -> Iterable[Metric]:
        # Declared without values so registering does not touch Redis.
        return []


class Telemetry:
    """The scheduler's metric families on their own registry, fed from Redis and the service.

    ``redis`` is a ``redis.Redis`` client (any client with ``scard`` and ``xrange``); without
    one, only what is pushed in (:meth:`observe_placement_latency`, :meth:`ingest_event`)
    is exported.
    """

    def __init__(
        self,
        redis: Any | None = None,
        *,
        keys: Keys | None = None,
        registry: CollectorRegistry | None = None,
        max_users: int = DEFAULT_MAX_USERS,
        max_teams: int = DEFAULT_MAX_TEAMS,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._last_id = "0-0"
        # (job, attempt) -> option of its placement: workers' finished/oom events carry no
        # option, so the prediction they are compared against comes from the placed event.
        self._placed: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        # Registered first: a scrape tails the stream before the counters below are read.
        if redis is not None:
            self.registry.register(_RedisCollector(self))
        r = self.registry
        self.placement_latency = Histogram(
            "snugfit_placement_latency_seconds",
            "Time from the scheduler picking up a pending job to its placement being committed.",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.placements = Counter(
            "snugfit_placements",
            "Jobs placed, by GPU type, option kind (whole/mig/shared) and policy.",
            ["gpu_type", "kind", "policy"],
            registry=r,
        )
        self.oom_kills = Counter(
            "snugfit_oom_kills",
            "Attempts killed by a CUDA out-of-memory.",
            ["gpu_type"],
            registry=r,
        )
        self.reclaimed_leases = Counter(
            "snugfit_reclaimed_leases",
            "Running jobs whose worker stopped heartbeating; their capacity was reclaimed.",
            registry=r,
        )
        self.events = Counter(
            "snugfit_events", "Placement-log events by kind.", ["event"], registry=r
        )
        self.vram_ratio = Histogram(
            "snugfit_prediction_vram_ratio",
            "Measured peak VRAM / predicted peak VRAM per finished attempt.",
            ["gpu_type"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        # user / team labels, bounded (scheduler.service._user_metrics).
        self.users = UserMetrics(r, max_users=max_users, max_teams=max_teams)
        self._who: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self.runtime_ratio = Histogram(
            "snugfit_prediction_runtime_ratio",
            "Measured runtime / predicted runtime per finished attempt.",
            ["gpu_type"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )

    # -- pushed by the service ------------------------------------------------------------------

    def observe_placement_latency(self, seconds: float) -> None:
        """The service calls this once per committed placement (its wall time, seconds)."""
        if math.isfinite(seconds) and seconds >= 0:
            self.placement_latency.observe(seconds)

    # -- derived from Redis ---------------------------------------------------------------------

    def queue_depth(self) -> dict[str, int]:
        if self.redis is None:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        states = [s.value for s in JobState]
        for s in states:
            pipe.scard(self.keys.state(s))
        return {s: int(n) for s, n in zip(states, pipe.execute(), strict=True)}

    def poll_events(self) -> int:
        """Ingest every event appended since the last call; returns how many."""
        if self.redis is None:
            return 0
        with self._lock:
            seen = 0
            while True:
                start = "(" + self._last_id if self._last_id != "0-0" else "-"
                entries = self.redis.xrange(self.keys.events, min=start, count=_XRANGE_CHUNK)
                if not entries:
                    return seen
                decoded: list[tuple[str, Any]] = []
                for entry_id, fields in entries:
                    raw = fields.get(b"e", fields.get("e"))
                    try:
                        event = json.loads(raw) if raw is not None else None
                    except (ValueError, TypeError):
                        event = None
                    decoded.append((_text(entry_id), event))
                self._prefetch_who([e for _, e in decoded if isinstance(e, dict)])
                for entry_id, event in decoded:
                    self._last_id = entry_id
                    if isinstance(event, dict):
                        self.ingest_event(event)
                    seen += 1
                if len(entries) < _XRANGE_CHUNK:
                    return seen

    def ingest_event(self, event: Mapping[str, Any]) -> None:
        """Update the counters and histograms from one placement-log event (keys.py schema)."""
        kind = str(event.get("event", ""))
        if kind not in EVENT_KINDS:
            return
        self.events.labels(kind).inc()
        opt = event.get("option") if isinstance(event.get("option"), dict) else None
        key = (str(event.get("job_id")), int(event.get("attempt") or 0))
        if kind == "placed" and opt is not None:
            self._placed[key] = opt
            if len(self._placed) > _MAX_REMEMBERED_PLACEMENTS:
                self._placed.popitem(last=False)
        elif opt is None and kind in ("finished", "oom"):
            opt = self._placed.pop(key, None)
        gpu_type = str(opt.get("gpu_type", "unknown")) if opt else "unknown"
        if kind == "placed" and opt is not None:
            self.placements.labels(
                gpu_type, str(opt.get("kind", "unknown")), str(event.get("policy") or "unknown")
            ).inc()
            self.users.placed(key, *self._who_of(event), event)
        elif kind == "oom":
            self.oom_kills.labels(gpu_type).inc()
        elif kind == "reclaimed":
            self.reclaimed_leases.inc()
        if kind in END_EVENTS:
            self.users.ended(key, event)
        if kind in ("finished", "oom") and opt is not None:
            out = event.get("outcome") if isinstance(event.get("outcome"), dict) else None
            if out is None:
                return
            vram = _ratio(out.get("peak_vram_gib"), opt.get("vram_gib"))
            if vram is not None:
                self.vram_ratio.labels(gpu_type).observe(vram)
            # An OOM-killed attempt's runtime is truncated; only whole runs say how fast it was.
            if kind == "finished":
                rt = _ratio(out.get("runtime_s"), opt.get("runtime_s"))
                if rt is not None:
                    self.runtime_ratio.labels(gpu_type).observe(rt)

    def _who_of(self, event: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """(user, team) of a placed event: its own fields, else the job record's."""
        if "user" in event:
            return event.get("user"), event.get("team")
        return self._who.get(str(event.get("job_id")), (None, None))

    def _prefetch_who(self, events: list[dict[str, Any]]) -> None:
        """Read user and team of the chunk's placed jobs in one pipelined round trip."""
        if self.redis is None:
            return
        ids = list(
            dict.fromkeys(
                str(e.get("job_id"))
                for e in events
                if e.get("event") == "placed" and "user" not in e and e.get("job_id")
            )
        )
        ids = [j for j in ids if j not in self._who]
        if not ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for j in ids:
            pipe.hmget(self.keys.job(j), ["user", "team"])
        for j, (u, t) in zip(ids, pipe.execute(), strict=True):
            self._who[j] = (None if u is None else _text(u), None if t is None else _text(t))
        while len(self._who) > _MAX_REMEMBERED_PLACEMENTS:
            self._who.popitem(last=False)

    def serve(self, port: int, addr: str = DEFAULT_METRICS_HOST) -> Any:
        """Serve ``/metrics`` on a daemon thread; returns the HTTP server (``.shutdown()``)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


def start_metrics_server(
    port: int,
    redis: Any | None = None,
    *,
    keys: Keys | None = None,
    addr: str = DEFAULT_METRICS_HOST,
) -> tuple[Telemetry, Any]:
    """Start serving the scheduler's metrics; returns the :class:`Telemetry` and the server."""
    telemetry = Telemetry(redis, keys=keys)
    return telemetry, telemetry.serve(port, addr)


def _ratio(measured: Any, predicted: Any) -> float | None:
    try:
        m, p = float(measured), float(predicted)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(m) and math.isfinite(p)) or p <= 0 or m < 0:
        return None
    return m / p


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
