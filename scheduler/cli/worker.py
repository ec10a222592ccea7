"""``snugfit worker --node NAME``: run the node's worker (one queue, JSON serializer)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from scheduler.cli._options import (
    home_file_option,
    node_heartbeat_option,
    pool_option,
    redis_option,
)

__all__ = ["worker_command"]


@click.command("worker")
@click.option("--node", required=True, help="Node name as in the pool file.")
@pool_option(
    default=None,
    help="Pool: a TOML file or a shipped pool name (default: the pool the scheduler stored "
    "in Redis).",
)
@click.option("--simulate", is_flag=True, help="Simulated execution (no GPU): scaled time.")
@click.option(
    "--time-scale",
    type=float,
    default=None,
    help="Real seconds per simulated second: a simulated 1 h run sleeps 3600 × this "
    "(default $SNUGFIT_TIME_SCALE or 1e-3).",
)
@click.option(
    "--truth-seed",
    type=int,
    default=None,
    help="Seed of the simulated truth (--simulate), as `snugfit simulate --seed` uses it "
    "(default $SNUGFIT_TRUTH_SEED or 0).",
)
@redis_option
@click.option(
    "--lease",
    type=float,
    default=10.0,
    show_default=True,
    help="Job lease, seconds (renewed every --heartbeat).",
)
@click.option("--heartbeat", type=float, default=1.0, show_default=True)
@home_file_option("--history", what="History JSONL", name="history.jsonl")
@node_heartbeat_option
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
@click.option("-v", "--verbose", is_flag=True)
def worker_command(
    node: str,
    pool_file: Path | None,
    simulate: bool,
    time_scale: float | None,
    truth_seed: int | None,
    redis_url: str | None,
    lease: float,
    heartbeat: float,
    history: Path | None,
    node_heartbeat: float,
    burst: bool,
    verbose: bool,
) -> None:
    """Run the worker of one node: it listens on that node's queue only."""
    from scheduler.core.pool import load_pool
    from scheduler.exceptions import SchedulerError
    from scheduler.service.store.embedded import snugfit_home
    from scheduler.service.store.redis_store import open_store
    from workers.exceptions import WorkerError
    from workers.worker import NodeWorker

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    scale = (
        time_scale
        if time_scale is not None
        else float(os.environ.get("SNUGFIT_TIME_SCALE", "1e-3"))
    )
    try:
        pool = load_pool(pool_file) if pool_file is not None else None
        home = snugfit_home()
        w = NodeWorker(
            open_store(redis_url),
            node,
            pool=pool,
            simulate=simulate,
            time_scale=scale,
            truth_seed=truth_seed
            if truth_seed is not None
            else int(os.environ.get("SNUGFIT_TRUTH_SEED", "0")),
            lease_s=lease,
            heartbeat_s=heartbeat,
            history_path=history or home / "history.jsonl",
            log_path=home / "placement-log.jsonl",
            home=home,
            node_heartbeat_s=node_heartbeat,
        )
    except (SchedulerError, WorkerError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"worker {w.name}: queue snugfit:node:{node}"
        f"{' (SIMULATED, time scale ' + str(scale) + ')' if simulate else ''}",
        err=True,
    )
    w.work(burst=burst)
