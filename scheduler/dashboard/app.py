"""The dashboard's Starlette application: read-only pages and the JSON behind each.

=============================  ===========================================================
``/``                          the pool: per node and GPU reserved vs used VRAM, MIG layout,
                               the job on each slot, free capacity by type
``/queue``                     pending, placed and running jobs with pending reasons; the
                               newest jobs of any state
``/job/{id}``                  the ``explain`` table, VRAM breakdown, predicted vs actual
``/log``                       the placement log, live over server-sent events
``/usage``                     cost and GPU-hours over time (chart)
``/api/pool|queue|usage``      the JSON each page is drawn from; ``/api/job/{id}``
``/api/events``                the newest placement-log events (``?limit=N``)
``/api/events/stream``         server-sent events: one ``placement`` event per log entry
                               from ``?after=ID`` / ``Last-Event-ID`` (default: from now)
``/fragment/...``              the live part of a page as HTML (what the page re-fetches)
``/metrics``                   Prometheus, when the scheduler serves the dashboard
``/healthz``                   ``{"ok": true}`` while Redis answers
=============================  ===========================================================

Handlers are plain functions (Starlette runs them in its thread pool) over a
:class:`~scheduler.service.store.redis_store.RedisStore`; the event stream polls the store
from the event loop through that pool too, so a slow Redis never blocks other requests.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import jinja2
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from scheduler.cli.render import event_line, fmt_duration, fmt_gib, fmt_usd
from scheduler.dashboard.job_view import job_data
from scheduler.dashboard.pool_view import pool_data
from scheduler.dashboard.queue_view import QueueFilter, queue_data
from scheduler.dashboard.reads import last_event_id, newest_events
from scheduler.dashboard.usage import UsageTail, usage_series
from scheduler.exceptions import SchedulerError
from scheduler.service.store.keys import JobState

__all__ = ["DashboardConfig", "create_app"]

_MAX_EVENTS = 2000
_MAX_QUEUE_ROWS = 5000
_KEEPALIVE_S = 15.0


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """How the dashboard reads and shows the cluster."""

    #: Real seconds per workload second of the runs shown (1 on a real cluster; the demo's
    #: accelerated simulated runs pass theirs), so elapsed times compare with predictions.
    time_scale: float = 1.0
    #: A node whose worker heartbeat is older than this shows as down (the scheduler's
    #: ``--node-stale``).
    node_stale_s: float = 15.0
    #: Seconds between the pages' refreshes of their live part.
    refresh_s: float = 2.0
    #: Seconds between the event stream's reads of the placement log.
    stream_poll_s: float = 0.5
    #: Events the placement-log page starts with.
    log_rows: int = 200
    #: Active jobs the queue page lists (running and placed first; ``?limit=N`` changes it).
    queue_rows: int = 200


def _json(data: Any, status_code: int = 200) -> Response:
    body = json.dumps(data, default=str, separators=(",", ":"))
    return Response(body, status_code=status_code, media_type="application/json")


def _fmt_ts(ts: Any) -> str:
    if not isinstance(ts, int | float) or not math.isfinite(ts):
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) or not math.isfinite(x) else f"{x:.0%}"


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("scheduler.dashboard", "templates"),
        autoescape=True,
    )
    env.filters.update(duration=fmt_duration, gib=fmt_gib, usd=fmt_usd, ts=_fmt_ts, pct=_pct)
    env.filters["event_line"] = event_line
    return Jinja2Templates(env=env)


def create_app(
    store: Any,
    *,
    config: DashboardConfig | None = None,
    telemetry: Any | None = None,
) -> Starlette:
    """The dashboard over ``store`` (a RedisStore). ``telemetry`` (a
    :class:`~scheduler.service.telemetry.Telemetry`) adds its ``/metrics``."""
    cfg = config or DashboardConfig()
    h = _Handlers(store, cfg)
    routes = [
        Route("/", h.pool_page),
        Route("/queue", h.queue_page),
        Route("/job/{job_id:path}", h.job_page),
        Route("/log", h.log_page),
        Route("/usage", h.usage_page),
        Route("/fragment/pool", h.pool_fragment),
        Route("/fragment/queue", h.queue_fragment),
        Route("/fragment/counts", h.counts_fragment),
        Route("/fragment/job/{job_id:path}", h.job_fragment),
        Route("/api/pool", h.api_pool),
        Route("/api/queue", h.api_queue),
        Route("/api/job/{job_id:path}", h.api_job),
        Route("/api/usage", h.api_usage),
        Route("/api/events", h.api_events),
        Route("/api/events/stream", h.api_stream),
        Route("/healthz", h.healthz),
        Mount("/static", StaticFiles(packages=[("scheduler.dashboard", "static")]), name="static"),
    ]
    if telemetry is not None:
        routes.append(Route("/metrics", _metrics_endpoint(telemetry)))
    handlers: Any = {RedisError: _error_page, SchedulerError: _error_page}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.store = store
    app.state.config = cfg
    return app


class _Handlers:
    """The endpoints over one store. Plain methods run in Starlette's thread pool; only the
    event stream is async (it sleeps between reads instead of holding a thread)."""

    def __init__(self, store: Any, cfg: DashboardConfig) -> None:
        self.store = store
        self.cfg = cfg
        self.templates = _templates()
        self.usage = UsageTail(store)

    # -- rendering ---------------------------------------------------------------------------

    def _counts(self) -> dict[str, int]:
        return {s.value: self.store.count(s.value) for s in JobState}

    def _page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("counts", self._counts())
        context.setdefault("pool_name", self.store.r.hget(self.store.keys.pool, "name"))
        context.setdefault("refresh_ms", int(self.cfg.refresh_s * 1000))
        context.setdefault("fragment", None)
        context.setdefault("time_scale", self.cfg.time_scale)
        return self.templates.TemplateResponse(
            request, name, {"cfg": self.cfg, **context}, status_code=status
        )

    def _fragment(self, request: Request, name: str, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, {"cfg": self.cfg, **context})

    def _pool(self) -> dict[str, Any]:
        return pool_data(self.store, now=time.time(), stale_s=self.cfg.node_stale_s)

    def _queue(self, request: Request) -> dict[str, Any]:
        limit = _int_param(request, "limit", self.cfg.queue_rows, 1, _MAX_QUEUE_ROWS)
        q = request.query_params

        def values(name: str) -> frozenset[str]:
            return frozenset(v for raw in q.getlist(name) for v in raw.split(",") if v)

        where = QueueFilter(values("state"), values("user"), values("team"))
        return queue_data(
            self.store, now=time.time(), time_scale=self.cfg.time_scale, limit=limit, where=where
        )

    # -- pages -------------------------------------------------------------------------------

    def pool_page(self, request: Request) -> Response:
        return self._page(request, "pool.html", fragment="/fragment/pool", pool=self._pool())

    def queue_page(self, request: Request) -> Response:
        # The live refresh keeps the page's own query (?limit=N).
        query = f"?{request.url.query}" if request.url.query else ""
        return self._page(
            request, "queue.html", fragment=f"/fragment/queue{query}", queue=self._queue(request)
        )

    def job_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = job_data(self.store, job_id)
        if job is None:
            return self._page(request, "missing.html", status=404, job_id=job_id)
        return self._page(request, "job.html", job=job, fragment=f"/fragment/job/{_quote(job_id)}")

    def log_page(self, request: Request) -> Response:
        events = newest_events(self.store, self.cfg.log_rows)
        after = events[-1][0] if events else "0"
        return self._page(request, "log.html", events=list(reversed(events)), after=after)

    def usage_page(self, request: Request) -> Response:
        return self._page(request, "usage.html", usage=usage_series(self.usage.poll()))

    # -- fragments (the live part of each page) ------------------------------------------------

    def pool_fragment(self, request: Request) -> Response:
        return self._fragment(request, "_pool.html", pool=self._pool())

    def counts_fragment(self, request: Request) -> Response:
        return self._fragment(request, "_counts.html", counts=self._counts())

    def queue_fragment(self, request: Request) -> Response:
        return self._fragment(request, "_queue.html", queue=self._queue(request))

    def job_fragment(self, request: Request) -> Response:
        job = job_data(self.store, request.path_params["job_id"])
        if job is None:
            return HTMLResponse("<p class='error'>no such job</p>", status_code=404)
        return self._fragment(request, "_job.html", job=job)

    # -- JSON ----------------------------------------------------------------------------------

    def api_pool(self, request: Request) -> Response:
        return _json(self._pool())

    def api_queue(self, request: Request) -> Response:
        return _json(self._queue(request))

    def api_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = job_data(self.store, job_id)
        if job is None:
            return _json({"error": f"no job with id {job_id!r}"}, 404)
        return _json(job)

    def api_usage(self, request: Request) -> Response:
        return _json(usage_series(self.usage.poll()))

    def api_events(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 200, 0, _MAX_EVENTS)
        return _json([{"id": eid, **e} for eid, e in newest_events(self.store, limit)])

    async def api_stream(self, request: Request) -> Response:
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        if not after or after == "$":
            after = await anyio.to_thread.run_sync(last_event_id, self.store)
        max_events = _int_param(request, "max_events", 0, 0, 1_000_000)
        gen = _event_stream(request, self.store, str(after), self.cfg.stream_poll_s, max_events)
        return StreamingResponse(
            gen,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def healthz(self, request: Request) -> Response:
        try:
            self.store.r.ping()
        except Exception as exc:  # a health check reports, never raises
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
        return JSONResponse({"ok": True})


def _metrics_endpoint(telemetry: Any) -> Any:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def metrics(request: Request) -> Response:
        # A scrape tails the placement log in Redis: a plain function, so it runs in the
        # thread pool and not on the event loop.
        return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


async def _event_stream(
    request: Request, store: Any, after: str, poll_s: float, max_events: int
) -> AsyncIterator[str]:
    """``text/event-stream`` frames: each log entry as a ``placement`` event whose ``id`` is
    its stream id (a reconnecting browser resumes from ``Last-Event-ID``)."""
    yield "retry: 2000\n: connected\n\n"
    sent = 0
    quiet_since = time.monotonic()
    while not await request.is_disconnected():
        page = await anyio.to_thread.run_sync(store.events, after, 500)
        for eid, event in page:
            after = eid
            data = {"id": eid, "line": event_line(event), **event}
            yield f"id: {eid}\nevent: placement\ndata: {json.dumps(data, default=str)}\n\n"
            sent += 1
            if max_events and sent >= max_events:
                return
        if page:
            quiet_since = time.monotonic()
            continue
        if time.monotonic() - quiet_since >= _KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
        await anyio.sleep(poll_s)


async def _error_page(request: Request, exc: Exception) -> Response:
    """Redis down or a record nobody can read: say so, with the fix, instead of a traceback."""
    msg = (
        f"the dashboard could not read the cluster: {type(exc).__name__}: {exc}. Is Redis "
        "reachable at the URL given with --redis (or $SNUGFIT_REDIS_URL)?"
    )
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": msg}, status_code=503)
    return HTMLResponse(
        f"<!doctype html><title>snugfit dashboard: error</title><p>{_escape(msg)}</p>",
        status_code=503,
    )


def _escape(s: str) -> str:
    from markupsafe import escape

    return str(escape(s))


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    try:
        v = int(raw) if raw is not None else default
    except ValueError:
        v = default
    return min(max(v, lo), hi)
