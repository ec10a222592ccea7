"""``snugfit submit | status | cancel | logs | scheduler``: thin wrappers over the client and
the scheduler service. Redis comes from ``--redis`` / ``SNUGFIT_REDIS_URL`` / the embedded one."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

import click

from scheduler.cli._options import (
    client_for,
    home_file_option,
    host_option,
    node_stale_option,
    pool_option,
    port_option,
    redis_option,
)
from scheduler.cli.output import Output, output_options
from scheduler.service.retrain import DEFAULT_RETRAIN_HOURS, DEFAULT_RETRAIN_ROWS

__all__ = [
    "cancel_command",
    "logs_command",
    "scheduler_command",
    "status_command",
    "submit_command",
]


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.command("submit")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the job ids as JSON.")
@click.option(
    "-a",
    "--array",
    "array",
    default=None,
    help="Submit the job once per index: 0-99, 0-9:2 (step) or 1,3,5. {index} in id, command, "
    "env, workdir and depends_on becomes the index; an id without it gets -{index}.",
)
@click.option(
    "--chain", is_flag=True, help="With --array: each element waits for the previous to succeed."
)
@click.option("-H", "--hold", is_flag=True, help="Submit held: placed only after `release`.")
@click.option(
    "--trace-budget",
    "trace_budget_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Wait up to this long in all for the jobs' CPU traces before predicting (default: "
    "$SNUGFIT_TRACE_BUDGET_S, else 15; 0: predict at once). A cached trace answers at once; "
    "one still running finishes in the background for the next submit.",
)
def submit_command(
    job_file: Path,
    redis_url: str | None,
    as_json: bool,
    array: str | None,
    chain: bool,
    hold: bool,
    trace_budget_s: float | None,
) -> None:
    """Submit every job in JOB_FILE (YAML / JSON / JSONL); prints one id per line."""
    from predictor.exceptions import PredictorError
    from scheduler.exceptions import SchedulerError

    if chain and array is None:
        raise click.UsageError("--chain needs --array (e.g. --array 0-9 --chain)")
    try:
        client = client_for(redis_url, trace_budget_s)
        if array is not None:
            handles = client.submit_array(job_file, array, chain=chain, hold=hold)
        else:
            handles = client.submit_many([job_file], hold=hold)
        hopeless = _fits_nowhere(client, [h.id for h in handles])
    except (PredictorError, SchedulerError) as exc:
        raise _fail(exc) from None
    ids = [h.id for h in handles]
    click.echo(json.dumps(ids) if as_json else "\n".join(ids))
    if hopeless:
        for line in hopeless:
            click.echo(f"Error: {line}", err=True)
        raise SystemExit(1)


def _fits_nowhere(client: Any, ids: list[str]) -> list[str]:
    """Why each of ``ids`` will be rejected at once (it fits nowhere even on the empty pool the
    scheduler published), with the option that came closest; empty when all can run. Nothing is
    known before a scheduler has published its pool."""
    from scheduler.core.options import enumerate_options, fits_anywhere_many
    from scheduler.core.pool import Pool
    from scheduler.service._intake import InvalidRecord, decode_request

    config = client.store.pool_config()
    if config is None or not ids:
        return []
    pool = Pool.from_dict(config)
    fields = ["state", "attempt", "submitted_at", "reserved_gib", "request"]
    reqs = []
    for jid, row in zip(ids, client.store.get_fields(ids, fields), strict=True):
        try:
            reqs.append(decode_request(pool, jid, "pending", *row[1:]))
        except InvalidRecord:
            continue
    out = []
    empty = pool.state()
    for req, ok in zip(reqs, fits_anywhere_many(reqs, pool), strict=True):
        if ok:
            continue
        opts = [o for o in enumerate_options(req, empty) if o.reason]
        short = [o for o in opts if o.reserved_gib > o.capacity_gib]
        line = f"job {req.job_id!r} fits no GPU of pool {pool.name!r} and will be rejected"
        if short:
            best = min(short, key=lambda o: o.reserved_gib - o.capacity_gib)
            line += (
                f"; closest: {best.reason} ({best.reserved_gib - best.capacity_gib:.1f} GiB "
                "short per GPU): lower batch_size or seq_len, quantise the weights, or shard "
                "it (tensor_parallel / zero_stage)"
            )
        elif opts:
            line += f": {opts[0].reason}"
        out.append(line)
    return out


@click.command("status")
@click.argument("job_id", required=False)
@click.option("--state", default=None, help="Only jobs in this state.")
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the record(s) as JSON.")
def status_command(
    job_id: str | None, state: str | None, redis_url: str | None, as_json: bool
) -> None:
    """Show one job's status, or a count per state and the jobs in --state."""
    from scheduler.exceptions import SchedulerError

    try:
        client = client_for(redis_url)
        if job_id is not None:
            h = client.get(job_id)
            rec = h.record()
            if as_json:
                from scheduler.cli._views import job_view
                from scheduler.cli.output import dumps_json

                click.echo(dumps_json(job_view(rec)))
                return
            p = h.placement
            o = h.outcome
            click.echo(f"{h.id}: {rec.get('state')}")
            if p is not None:
                click.echo(
                    f"  placement: {p.label} on {p.node} (attempt {p.attempt}, "
                    f"reserved {p.reserved_gib:.1f} GiB{', simulated' if p.simulated else ''})"
                )
            if o is not None:
                click.echo(
                    f"  outcome: exit {_or_dash(o.exit_code)}, peak {_or_dash(o.peak_vram_gib)} "
                    f"GiB, runtime {_or_dash(o.runtime_s)} s, oom {o.oom}"
                    f"{', SIMULATED' if o.simulated else ''}"
                )
            if rec.get("reason"):
                click.echo(f"  reason: {rec['reason']}")
            return
        counts = client.counts()
        if as_json:
            out: dict[str, Any] = {"counts": counts}
            if state:
                out["jobs"] = [h.id for h in client.jobs(state)]
            click.echo(json.dumps(out))
            return
        click.echo("  ".join(f"{k}: {v}" for k, v in counts.items()))
        if state:
            for h in client.jobs(state):
                click.echo(h.id)
    except SchedulerError as exc:
        raise _fail(exc) from None


def _or_dash(v: object) -> str:
    return "-" if v is None else str(v)


@click.command("cancel")
@click.argument("job_id")
@redis_option
@output_options(table=False, json_help="Print {id, result} as JSON.")
def cancel_command(job_id: str, redis_url: str | None, out: Output) -> None:
    """Cancel a job (a running one is stopped by its worker)."""
    from scheduler.cli._views import CancelView
    from scheduler.exceptions import SchedulerError

    try:
        got = client_for(redis_url).cancel(job_id)
    except SchedulerError as exc:
        raise _fail(exc) from None
    if out.json:
        out.emit_json(CancelView(id=job_id, result=got))
        return
    click.echo(f"{job_id}: {got}")


@click.command("logs")
@click.argument("job_id")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing new output until the job ends (waits for a job that has not started; "
    "exit status 0 if it succeeded, 1 otherwise; Ctrl-C stops following).",
)
@redis_option
@output_options(
    table=False,
    json_help="JSON: {id, state, attempt, text}; with -f one object per line (kind output, "
    "state or end).",
)
def logs_command(job_id: str, follow: bool, redis_url: str | None, out: Output) -> None:
    """Print a job's captured stdout/stderr (the last 1 MiB)."""
    from scheduler.cli._follow import follow_logs, print_logs
    from scheduler.exceptions import SchedulerError

    try:
        client = client_for(redis_url)
        if follow:
            raise SystemExit(follow_logs(client, job_id, out))
        print_logs(client, job_id, out)
    except SchedulerError as exc:
        raise _fail(exc) from None


def _retrain_policy(redis_url: str | None, rows: int, hours: float, data: tuple[str, ...]) -> Any:
    import os

    from scheduler.service.retrain import RetrainPolicy
    from scheduler.service.store.embedded import ENV_URL, embedded_url

    if rows == 0:
        return None
    url = redis_url or os.environ.get(ENV_URL) or embedded_url()
    return RetrainPolicy(url, every_rows=rows, every_hours=hours, data=data)


@click.command("scheduler")
@pool_option()
@click.option("--policy", default="rightsize", show_default=True)
@redis_option
@click.option(
    "--lease-ttl",
    type=float,
    default=5.0,
    show_default=True,
    help="Leader lease, seconds; a standby takes over within it.",
)
@click.option(
    "--window",
    type=int,
    default=5000,
    show_default=True,
    help="Pending jobs considered per step (memory stays flat beyond it).",
)
@home_file_option("--log-file", what="Placement log JSONL", name="placement-log.jsonl")
@click.option("--simulated", is_flag=True, help="Label placements as simulated (demo, tests).")
@node_stale_option(
    help="A node whose worker heartbeat is older than this takes no new placements, and its "
    "unstarted jobs move elsewhere (no retry used)."
)
@port_option(
    "--metrics-port", default=None, help="Serve Prometheus metrics on this port (/metrics)."
)
@host_option(
    "--metrics-host", help="Address the metrics endpoint binds; 0.0.0.0 exposes it to the network."
)
@click.option(
    "--dashboard",
    is_flag=True,
    help="Also serve the read-only web dashboard on the metrics port, beside /metrics "
    "(port 8765 when --metrics-port is not given).",
)
@click.option(
    "--retrain-rows",
    type=click.IntRange(min=0),
    default=DEFAULT_RETRAIN_ROWS,
    show_default=True,
    help="Retrain the learned tier (in another process) every N new real history rows; 0 "
    "turns retraining off. The new artifact replaces $SNUGFIT_HOME/artifacts/learned.json "
    "only if grouped CV says it is no worse.",
)
@click.option(
    "--retrain-hours",
    type=click.FloatRange(min=0.0, min_open=True),
    default=DEFAULT_RETRAIN_HOURS,
    show_default=True,
    help="...or after this many hours with at least one new row, whichever comes first.",
)
@click.option(
    "--retrain-data",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Published measurement file(s) retraining starts from (default datasets/measured).",
)
@click.option("-v", "--verbose", is_flag=True)
def scheduler_command(
    pool_file: Path,
    policy: str,
    redis_url: str | None,
    lease_ttl: float,
    window: int,
    log_file: Path | None,
    simulated: bool,
    node_stale: float,
    metrics_port: int | None,
    metrics_host: str,
    dashboard: bool,
    retrain_rows: int,
    retrain_hours: float,
    retrain_data: tuple[str, ...],
    verbose: bool,
) -> None:
    """Run the scheduler service (leader election: start several, one leads)."""
    from scheduler.core.pool import load_pool
    from scheduler.exceptions import SchedulerError
    from scheduler.service.leader import SchedulerService
    from scheduler.service.store.embedded import snugfit_home
    from scheduler.service.store.redis_store import open_store

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        store = open_store(redis_url)
        telemetry: Any = None
        server: Any = None
        if dashboard:
            from scheduler.cli.dashboard import start_with_metrics

            telemetry, server = start_with_metrics(store, metrics_host, metrics_port)
        elif metrics_port is not None:
            from scheduler.service.telemetry import start_metrics_server

            try:
                telemetry, server = start_metrics_server(
                    metrics_port, store.raw, keys=store.keys, addr=metrics_host
                )
            except OSError as exc:
                raise click.ClickException(
                    f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                    f"{exc.strerror or exc}; pick a free port with --metrics-port or another "
                    "address with --metrics-host"
                ) from None
        svc = SchedulerService(
            store,
            load_pool(pool_file),
            policy,
            lease_ttl_s=lease_ttl,
            window=window,
            log_path=log_file or snugfit_home() / "placement-log.jsonl",
            simulated=simulated,
            telemetry=telemetry,
            node_stale_s=node_stale,
            retrain=_retrain_policy(redis_url, retrain_rows, retrain_hours, retrain_data),
        )
    except SchedulerError as exc:
        raise _fail(exc) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"scheduler {svc.token}: pool {svc.pool.name!r}, policy {policy}", err=True)
    if dashboard:
        click.echo(f"dashboard: {server.url}  metrics: {server.url}metrics", err=True)
    elif server is not None:
        click.echo(f"metrics: http://{metrics_host}:{metrics_port}/metrics", err=True)
    try:
        svc.run(stop)
    except SchedulerError as exc:
        raise _fail(exc) from None
    finally:
        if server is not None:
            server.shutdown()
