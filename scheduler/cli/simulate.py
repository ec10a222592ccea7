"""``snugfit simulate``: the openb trace replay and the workload simulator."""

from __future__ import annotations

from pathlib import Path

import click

from scheduler.cli._options import pool_option
from scheduler.cli.output import Output, output_options

__all__ = ["simulate_command"]


@click.group(name="simulate", help="Run placement policies in the simulator.")
def simulate_command() -> None:
    pass


@simulate_command.command(name="openb")
@click.option("--nodes", type=click.Path(path_type=Path), default=None, help="Node csv.")
@click.option(
    "--pods",
    default=None,
    help="Pod list: a csv path, or a list name of the trace (default, gpuspec05, multigpu50, "
    "...). Default: default.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    default=("fgd",),
    show_default=True,
    help="rightsize (runs lookahead, ours, on openb pools), lookahead, fgdstrand, fgd, "
    "bestfit, random, dotproduct, gpupacking or gpuclustering; repeatable.",
)
@click.option("--seeds", type=int, default=10, show_default=True, help="Seeds 42, 43, ...")
@click.option(
    "--engine",
    type=click.Choice(["auto", "core", "replay"]),
    default="auto",
    show_default=True,
    help="core: snugfit's SchedulerCore and live policies on a pool built from the node list "
    "(a pod's gpu_spec is its node selector on the nodes' gpu-model label); replay: the "
    "vectorised reference replay; auto: core.",
)
@output_options(table=False, json_help="Print one JSON object.")
def openb_command(
    nodes: Path | None,
    pods: str | None,
    policies: tuple[str, ...],
    seeds: int,
    engine: str,
    out: Output,
) -> None:
    """Replay the Alibaba openb trace to 130% arrived GPU demand (FGD paper protocol).

    Simulated: no pod runs; unallocated GPU % is of the simulated cluster.
    """
    from scheduler.exceptions import SchedulerError
    from scheduler.sim.openb.core_replay import CORE_POLICY, replay_core
    from scheduler.sim.openb.replay import replay_seeds
    from scheduler.sim.openb.trace import DEFAULT_NODES_CSV, load_nodes, load_pods, pod_list_path

    if seeds < 1:
        raise click.BadParameter(f"must be at least 1; got {seeds}", param_hint="--seeds")
    try:
        cluster = load_nodes(nodes or DEFAULT_NODES_CSV)
        workload = load_pods(pod_list_path(pods or "default"))
        use_core = engine in ("core", "auto")
        seed_list = list(range(42, 42 + seeds))
        results = []
        for p in policies:
            if use_core:
                r = replay_seeds(cluster, workload, p, seed_list, runner=replay_core)
            else:
                # The replay has no rightsize: on openb pools rightsize delegates to lookahead.
                run_as = CORE_POLICY[p].value if p == "rightsize" else p
                r = replay_seeds(cluster, workload, run_as, seed_list)
                r["policy"], r["delegated_to"] = p, run_as
            r["simulated"] = True
            results.append(r)
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    if out.json:
        out.emit_json(results[0] if len(results) == 1 else {"policies": results})
        return
    for r in results:
        click.echo(
            f"{r['policy']:>14}: unallocated GPUs at 130% demand = "
            f"{r['unallocated_gpu_pct_at_130']:.2f}% (±{r['unallocated_gpu_pct_std']:.2f}, "
            f"{len(r['seeds'])} seeds, {r['wall_s_per_seed']:.1f} s/seed, "
            f"{r.get('engine', 'replay')}, simulated)"
        )


_TABLE_COLUMNS = (
    ("cost_usd", "cost $", "{:,.0f}"),
    ("gpu_hours", "GPU-h", "{:,.0f}"),
    ("reserved_over_actual_median", "res/act p50", "{:.2f}"),
    ("reserved_over_actual_p95", "res/act p95", "{:.2f}"),
    ("smallest_fit_rate", "smallest fit", "{:.0%}"),
    ("oom_kills", "OOM", "{}"),
    ("queue_delay_p95_s", "wait p95 s", "{:,.0f}"),
    ("jct_p50_s", "JCT p50 s", "{:,.0f}"),
    ("utilisation", "util", "{:.0%}"),
    ("n_rejected", "rejected", "{}"),
)


@simulate_command.command(name="workload")
@pool_option(dest="pool_path")
@click.option(
    "--policy", "policies", multiple=True, help="Repeatable; default rightsize+requested."
)
@click.option("--days", type=float, default=7.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--jobs-per-day", type=float, default=None, help="Override the mix's rate.")
@click.option(
    "--feedback/--no-feedback",
    default=True,
    show_default=True,
    help="Predict re-runs of a recurring job from its measured history, as the service does.",
)
@click.option(
    "--predictor",
    type=click.Choice(["analytical", "tiered"]),
    default="analytical",
    show_default=True,
    help="First-run predictions: the analytical tier, or the shipped learned tier (the service's).",
)
@output_options(json_help="Print one JSON object.")
def workload_command(
    pool_path: Path,
    policies: tuple[str, ...],
    days: float,
    seed: int,
    jobs_per_day: float | None,
    feedback: bool,
    predictor: str,
    out: Output,
) -> None:
    """Simulate the realistic workload on a pool, several policies side by side."""
    from scheduler.core.pool import load_pool
    from scheduler.exceptions import SchedulerError
    from scheduler.sim.simulator import simulate
    from scheduler.sim.workload import generate_workload

    names = policies or ("rightsize", "requested")
    try:
        pool = load_pool(pool_path)
        wl = generate_workload(days, seed, jobs_per_day=jobs_per_day)
        preds, predict = None, None
        if predictor == "tiered":
            from predictor.tiered import TieredPredictor

            predict = TieredPredictor.default().predict_table
            preds = predict(list(wl.specs))
        results = simulate(
            pool, names, wl, seed=seed, feedback=feedback, predictions=preds, predict=predict
        )
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    rows = [r.to_dict() for r in results]
    payload = {
        "pool": str(pool_path),
        "days": days,
        "seed": seed,
        "feedback": feedback,
        "predictor": predictor,
        "n_jobs": len(wl),
        "results": rows,
    }
    if out.json:
        out.emit_json(payload)
        return
    from rich.table import Table

    title = f"{len(wl)} jobs, {days:g} days, pool {pool.name}, seed {seed}"
    table = Table(title=title + (", history feedback" if feedback else ""))
    table.add_column("policy")
    for _, head, _ in _TABLE_COLUMNS:
        table.add_column(head, justify="right")
    for r in rows:
        cells = []
        for key, _, fmt in _TABLE_COLUMNS:
            v = r.get(key)
            cells.append("-" if v is None else fmt.format(v))
        table.add_row(str(r["policy"]), *cells)
    out.print(table)
