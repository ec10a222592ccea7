"""``snugfit demo``: the end-to-end demo on an embedded Redis (:mod:`scheduler.cli.demo.run`)."""

from __future__ import annotations

from pathlib import Path

import click

from scheduler.cli._options import pool_option, port_option, time_scale_option

__all__ = ["demo_command"]


@click.command(name="demo")
@click.option("--jobs", type=int, default=300, show_default=True, help="Jobs to submit.")
@click.option("--seed", type=int, default=0, show_default=True, help="Workload and truth seed.")
@time_scale_option(
    default=None, help="Real seconds per workload second (default: fit the run into about 40 s)."
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the report, summary and logs go (default: a new temp dir).",
)
@click.option("--no-live", is_flag=True, help="Plain progress lines instead of a live view.")
@pool_option(
    default=None,
    dest="pool_path",
    help="Pool: a TOML file or a shipped pool name (default: mixed, 32 GPUs).",
)
@click.option("--policy", default="rightsize", show_default=True, help="Live scheduler policy.")
@click.option(
    "--workers-per-node",
    type=int,
    default=None,
    help="Simulated worker processes per node (default: min(slots, 3)).",
)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@click.option(
    "--keep-redis",
    is_flag=True,
    help="Leave the private Redis running afterwards (explore with log / explain / pool).",
)
@port_option(
    "--dashboard-port",
    default=0,
    help="Port of the live web dashboard the demo serves on 127.0.0.1 (0: a free one).",
)
@click.option("--no-dashboard", is_flag=True, help="Do not serve the live web dashboard.")
def demo_command(
    jobs: int,
    seed: int,
    time_scale: float | None,
    output_dir: Path | None,
    no_live: bool,
    pool_path: Path | None,
    policy: str,
    workers_per_node: int | None,
    timeout_s: float,
    keep_redis: bool,
    dashboard_port: int,
    no_dashboard: bool,
) -> None:
    """Run the whole service on a private Redis with simulated GPU workers, submit a realistic
    workload in accelerated time, compare with the `requested` baseline, write an HTML report."""
    from scheduler.cli.demo.run import DEMO_POOL, DemoConfig, run_demo
    from scheduler.exceptions import SchedulerError

    if jobs < 1:
        raise click.BadParameter(f"must be at least 1; got {jobs}", param_hint="--jobs")
    cfg = DemoConfig(
        jobs=jobs,
        seed=seed,
        time_scale=time_scale,
        output_dir=output_dir,
        live=not no_live,
        pool_path=pool_path or DEMO_POOL,
        policy=policy,
        workers_per_node=workers_per_node,
        timeout_s=timeout_s,
        keep_redis=keep_redis,
        dashboard=not no_dashboard,
        dashboard_port=dashboard_port,
    )
    try:
        run_demo(cfg)
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        raise click.Abort() from None
