"""``snugfit dashboard``: serve the read-only web dashboard (:mod:`scheduler.dashboard`)."""

from __future__ import annotations

import logging
from typing import Any

import click

from scheduler.cli._options import (
    host_option,
    node_stale_option,
    port_option,
    store_options,
    time_scale_option,
)

__all__ = ["dashboard_command", "start_with_metrics"]


@click.command(name="dashboard")
@host_option(
    "--host", help="Address to bind; 0.0.0.0 exposes every job, user and cost to the network."
)
@port_option("--port", default=8765, help="Port to serve on (0 picks a free one and prints it).")
@store_options
@node_stale_option(help="A node whose worker heartbeat is older than this shows as down.")
@time_scale_option(
    default=1.0,
    help="Real seconds per workload second of the runs shown (a time-scaled simulated run).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log every request.")
def dashboard_command(
    host: str,
    port: int,
    url: str | None,
    prefix: str,
    node_stale: float,
    time_scale: float,
    verbose: bool,
) -> None:
    """Serve the live dashboard: the pool (reserved vs used VRAM per GPU, MIG layout, the job
    on each slot), the queue with pending reasons, each job's explain view, the placement log
    live, and cost and GPU-hours over time. Read-only. Ctrl-C stops it."""
    from scheduler.dashboard.app import DashboardConfig, create_app
    from scheduler.dashboard.server import bind, serve, url_of
    from scheduler.exceptions import ServiceError
    from scheduler.service.store.redis_store import open_store

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        store = open_store(url, prefix)
        sock = bind(host, port)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    app = create_app(store, config=DashboardConfig(time_scale=time_scale, node_stale_s=node_stale))
    click.echo(f"snugfit dashboard: {url_of(sock)}  (read-only; Ctrl-C stops it)", err=True)
    try:
        serve(app, sock, log_level="info" if verbose else "warning", access_log=verbose)
    finally:
        store.close()


def start_with_metrics(store: Any, host: str, port: int | None) -> tuple[Any, Any]:
    """For ``snugfit scheduler --dashboard``: the scheduler's :class:`Telemetry` and the
    dashboard serving it at ``/metrics``, on a background thread on ``host:port`` (8765 when
    None). Returns ``(telemetry, running dashboard)``; ``.shutdown()`` stops it."""
    from scheduler.dashboard.app import create_app
    from scheduler.dashboard.server import DEFAULT_PORT, start_in_thread
    from scheduler.exceptions import ServiceError
    from scheduler.service.telemetry import Telemetry

    telemetry = Telemetry(store.raw, keys=store.keys)
    app = create_app(store, telemetry=telemetry)
    try:
        running = start_in_thread(
            app,
            host,
            DEFAULT_PORT if port is None else port,
            flags=("--metrics-port", "--metrics-host"),
        )
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    return telemetry, running
