"""``snugfit serve scale ID --rate R`` and ``snugfit serve status [ID]``: serving deployments
(``task: serve`` jobs submitted with ``snugfit submit``); ``snugfit explain ID`` renders a
deployment with :func:`render_deployment`."""

from __future__ import annotations

import datetime as dt
import shlex
from typing import Any

import click

from scheduler.cli._options import redis_option
from scheduler.cli.output import dumps_json

__all__ = ["render_deployment", "serve_command"]


def _deployments(url: str | None) -> Any:
    from scheduler.service.client import Client

    return Client(url).deployments


def _when(t: float | None) -> str:
    if t is None:
        return "until cancelled"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _summary_lines(view: Any) -> list[str]:
    o = view.option
    where = o["gpu"] + (f" MIG {o['mig_profile']}" if o.get("mig_profile") else "")
    states: dict[str, int] = {}
    for s in view.replica_states.values():
        states[s] = states.get(s, 0) + 1
    per_replica = float(o["usd_per_hour"]) / max(1, int(o["replicas"]))
    lines = [
        f"{view.id}: {view.state}, {view.replicas} replica(s) of {where} TP{o['tensor_parallel']} "
        f"{o['weight_dtype']}/kv-{o['kv_cache_dtype']} at {view.request_rate:g} req/s, "
        f"${per_replica * view.replicas:.2f}/h; "
        + (f"ends {_when(view.expires_at)}" if view.state == "active" else view.reason),
        "  replicas: " + (", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none"),
        "  engine: " + " ".join(f"{k}={v!r}" for k, v in view.engine.items()),
    ]
    if view.replicas == 0:
        lines.append(
            f"  scaled to zero: the next request waits the cold start, about "
            f"{o['cold_start_s']:.0f} s"
        )
    return lines


def render_deployment(view: Any) -> list[Any]:
    """What ``snugfit explain`` prints for a deployment: its state and the plan table it was
    placed from (the chosen row marked), the reason, and the engine flags."""
    from predictor.spec import parse_spec
    from scheduler.cli.plan import contract_table, plan_title

    out: list[Any] = list(_summary_lines(view))
    title = plan_title(parse_spec(view.spec))
    out.append(contract_table(title, view.plan["options"], view.chosen))
    out.append(f"chosen: {view.plan.get('reason', view.reason)}")
    for engine, argv in (view.plan.get("engine_flags") or {}).items():
        out.append(f"  {engine}: {shlex.join(argv)}")
    return out


@click.group("serve")
def serve_command() -> None:
    """Serving deployments: `snugfit submit serve.yaml` plans and places them; these commands
    scale and inspect them (`snugfit cancel ID` ends one)."""


@serve_command.command("scale")
@click.argument("deployment_id")
@click.option(
    "--rate",
    type=float,
    required=True,
    help="New request rate, req/s; the replica count is re-planned (0 scales to zero).",
)
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def scale_command(deployment_id: str, rate: float, redis_url: str | None, as_json: bool) -> None:
    """Re-plan DEPLOYMENT_ID's replica count for --rate and add or remove replicas."""
    from scheduler.exceptions import SchedulerError

    try:
        res = _deployments(redis_url).scale(deployment_id, rate)
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            dumps_json(
                {
                    "id": res.deployment_id,
                    "rate": res.rate,
                    "replicas_before": res.before,
                    "replicas": res.after,
                    "added": list(res.added),
                    "removed": list(res.removed),
                    "usd_per_hour": round(res.usd_per_hour, 4),
                    "cold_start_s": res.cold_start_s,
                }
            )
        )
        return
    click.echo(res.summary())


@serve_command.command("status")
@click.argument("deployment_id", required=False)
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the deployment(s) as JSON.")
def status_command(deployment_id: str | None, redis_url: str | None, as_json: bool) -> None:
    """Show one deployment (replicas, cost, engine values), or list every deployment."""
    from scheduler.exceptions import SchedulerError

    deps = _deployments(redis_url)
    try:
        views = [deps.get(deployment_id)] if deployment_id else [deps.get(i) for i in deps.ids()]
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(dumps_json([v.to_dict() for v in views]))
        return
    if not views:
        click.echo("no deployments; submit a `task: serve` spec with `snugfit submit`")
    for v in views:
        lines = _summary_lines(v)
        click.echo("\n".join(lines if deployment_id else lines[:1]))
