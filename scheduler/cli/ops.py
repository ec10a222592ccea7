"""Operator commands: ``snugfit log``, ``snugfit explain ID`` and ``snugfit pool``.

They only read Redis (the layout in :mod:`scheduler.service.store.keys`), through
:func:`scheduler.service.store.embedded.connect` (``SNUGFIT_REDIS_URL`` or the embedded server), and
render with :mod:`scheduler.cli.render`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import click

from scheduler.cli._options import store_options
from scheduler.cli.output import Output, output_options

__all__ = [
    "connect_store",
    "decoded_allocations",
    "explain_command",
    "load_record",
    "log_command",
    "node_state_label",
    "number",
    "parse_record",
    "pool_command",
    "published_pool",
]

_JSON_FIELDS = (
    "spec",
    "request",
    "predictions",
    "decision",
    "placement",
    "outcome",
    "history_request",
    "engine",
)
_FLOAT_FIELDS = ("submitted_at", "updated_at", "started_at", "finished_at", "reserved_gib")
_INT_FIELDS = ("attempt", "max_retries", "lost", "moved", "ooms", "max_oom_retries")
_DECODERS: tuple[tuple[tuple[str, ...], Callable[[str], Any]], ...] = (
    (_JSON_FIELDS, json.loads),
    (_FLOAT_FIELDS, float),
    (_INT_FIELDS, int),
)
_PAGE = 1000
_BLOCK_MS = 1000


def parse_record(raw: Mapping[str, str]) -> dict[str, Any]:
    """A job hash with its JSON and numeric fields decoded; unreadable fields become None
    (and are listed under ``_unreadable``) so one corrupt field never hides the rest."""
    out: dict[str, Any] = dict(raw)
    bad: list[str] = []
    for fields, decode in _DECODERS:
        for k in fields:
            if k in raw:
                try:
                    out[k] = decode(raw[k])
                except (ValueError, TypeError):
                    out[k] = None
                    bad.append(k)
    # keys.py's ``simulated`` field, or the same label on the placement / outcome records.
    out["simulated"] = raw.get("simulated") == "1" or any(
        isinstance(out.get(k), dict) and out[k].get("simulated") is True
        for k in ("outcome", "placement")
    )
    if bad:
        out["_unreadable"] = bad
    return out


def connect_store(url: str | None, prefix: str) -> Any:
    """The cluster's store at ``url`` under ``prefix``; a connection error exits the command
    with its message."""
    from scheduler.exceptions import ServiceError
    from scheduler.service.store.redis_store import open_store

    try:
        return open_store(url, prefix)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None


def published_pool(store: Any, prefix: str) -> dict[str, Any]:
    """The pool the scheduler published (its config dict); exits the command when none is."""
    config = store.pool_config()
    if config is None:
        raise click.ClickException(
            f"no pool in Redis under {prefix}:pool; start `snugfit scheduler --pool FILE` "
            "first (it publishes the pool)"
        )
    return config  # type: ignore[no-any-return]


def number(v: Any) -> float | None:
    """``v`` as a finite float (a number or a numeric string), else ``None``: a missing,
    malformed or non-finite field shows as blank rather than failing the page."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def decoded_allocations(store: Any) -> dict[str, dict[str, Any]]:
    """Job id -> its allocation, decoded; an entry that is not a JSON object is skipped, so a
    corrupt one never hides the rest of the pool."""
    out: dict[str, dict[str, Any]] = {}
    for jid, raw in store.allocations().items():
        try:
            a = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if isinstance(a, dict):
            out[jid] = a
    return out


def load_record(store: Any, job_id: str) -> dict[str, Any]:
    raw = store.get_job(job_id)
    if raw is None:
        raise click.ClickException(
            f"no job with id {job_id!r} in {store.keys.prefix}:*; list jobs with `snugfit status`"
        )
    return parse_record(raw)


# ---------------------------------------------------------------------------------------------
# snugfit log


@click.command(name="log")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events as they arrive.")
@click.option("--job", "job_id", default=None, help="Only this job's events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "-n",
    "--last",
    type=click.IntRange(min=0),
    default=None,
    help="Start with the last N events (default: all; 0: none, e.g. with -f).",
)
@click.option(
    "--idle-exit",
    type=float,
    default=None,
    hidden=True,
    help="With -f: stop after this many seconds without a new event (tests, scripts).",
)
@store_options
def log_command(
    follow: bool,
    job_id: str | None,
    as_json: bool,
    last: int | None,
    idle_exit: float | None,
    url: str | None,
    prefix: str,
) -> None:
    """Show the placement log (the Redis stream <prefix>:events): placements, starts,
    finishes, OOMs, requeues and reclaims, each with its chosen option, cost and runner-up.
    Events print in time order; -n N keeps the last N (of --job's events, with --job)."""
    from scheduler.cli.render import event_line

    store = connect_store(url, prefix)
    key = store.keys.events

    def emit(event: Mapping[str, Any]) -> None:
        if job_id is not None and event.get("job_id") != job_id:
            return
        click.echo(json.dumps(event, separators=(",", ":")) if as_json else event_line(event))

    after = "0"
    if last is not None and last > 0 and job_id is None:
        tail = store.r.xrevrange(key, count=last)
        if tail:
            first = tail[-1][0]
            # XRANGE's exclusive start: step one sequence back from the first id to keep.
            ms, _, seq = first.partition("-")
            after = f"{ms}-{int(seq) - 1}" if int(seq) > 0 else f"{int(ms) - 1}-{2**63 - 1}"
    try:
        backlog: list[Mapping[str, Any]] = []
        while True:
            page = store.events(after=after, count=_PAGE)
            for eid, event in page:
                after = eid
                if job_id is None or event.get("job_id") == job_id:
                    backlog.append(event)
            if len(page) < _PAGE:
                break
        # Processes append with their own clocks, so stream order is not quite time order.
        backlog.sort(key=_event_ts)
        if last is not None:
            backlog = backlog[-last:] if last > 0 else []
        for event in backlog:
            emit(event)
        if not follow:
            return
        last_id = after if after != "0" else "0-0"
        idle_since = time.monotonic()
        while True:
            reply = store.r.xread({key: last_id}, count=_PAGE, block=_BLOCK_MS)
            if not reply:
                if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                    return
                continue
            idle_since = time.monotonic()
            for _stream, entries in reply:
                for eid, fields in entries:
                    last_id = eid
                    try:
                        event = json.loads(fields.get("e", "{}"))
                    except (ValueError, TypeError):
                        event = {"event": "invalid", "reason": "unreadable event entry"}
                    if isinstance(event, dict):
                        emit(event)
    except KeyboardInterrupt:
        return
    finally:
        store.close()


def _event_ts(event: Mapping[str, Any]) -> float:
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) and math.isfinite(ts) else math.inf


# ---------------------------------------------------------------------------------------------
# snugfit explain


@click.command(name="explain")
@click.argument("job_id")
@output_options(json_help="Print the typed job record as JSON (every option spelled out).")
@store_options
def explain_command(job_id: str, out: Output, url: str | None, prefix: str) -> None:
    """Why a job went where it went: every option considered (SkyPilot-style), the VRAM
    breakdown, predicted vs actual once it ran, and why it is pending (Slurm-style Reason)."""
    from scheduler.cli._views import job_view
    from scheduler.cli.render import explain
    from scheduler.core.decision import Decision
    from scheduler.exceptions import SchedulerError

    store = connect_store(url, prefix)
    derived = None
    try:
        if store.get_job(job_id) is None and _explain_deployment(store, job_id, out):
            return
        raw = store.get_job(job_id)
        rec = load_record(store, job_id)
        if not out.json and rec.get("state") == "pending" and rec.get("decision") is None:
            from scheduler.dashboard.pending import derived_pending

            derived = derived_pending(store, job_id, str(rec.get("reason") or ""))
    finally:
        store.close()
    if out.json:
        out.emit_json(job_view(raw or {}))
        return
    decision = derived
    if isinstance(rec.get("decision"), dict):
        try:
            decision = Decision.from_dict(rec["decision"])
        except (SchedulerError, KeyError, TypeError, ValueError) as exc:
            click.echo(f"(the stored decision is unreadable: {exc})", err=True)
    if derived is not None:
        click.echo(
            "(the scheduler stores no decision for a waiting job: these options are priced "
            "now, read-only, against the pool as it stands)",
            err=True,
        )
    preds = rec.get("predictions") if isinstance(rec.get("predictions"), dict) else None
    outcome = rec.get("outcome") if isinstance(rec.get("outcome"), dict) else None
    out.print(explain(rec, decision, predictions=preds, outcome=outcome))


def _explain_deployment(store: Any, dep_id: str, out: Output) -> bool:
    """A serving deployment's plan table (scheduler.cli.serve); False when there is none."""
    from scheduler.cli.serve import render_deployment
    from scheduler.service.deployments import Deployments

    deps = Deployments(store)
    if not deps.exists(dep_id):
        return False
    view = deps.get(dep_id)
    if out.json:
        out.emit_json({**view.to_dict(), "plan": view.plan})
        return True
    out.print(render_deployment(view))
    return True


# ---------------------------------------------------------------------------------------------
# snugfit pool


@click.command(name="pool")
@output_options(json_help="Print allocations, node states and free capacity as JSON.")
@click.option(
    "--heartbeat-s",
    type=float,
    default=15.0,
    show_default=True,
    help="A node whose worker heartbeat is older than this is shown as down (as the "
    "scheduler's --node-stale).",
)
@store_options
def pool_command(out: Output, heartbeat_s: float, url: str | None, prefix: str) -> None:
    """Pool occupancy: per node and GPU what runs where, reserved vs used VRAM, MIG layout,
    CPUs and host memory per node, and free capacity by GPU type."""
    from scheduler.cli.render import pool_view
    from scheduler.core.pool import Pool
    from scheduler.exceptions import SchedulerError

    store = connect_store(url, prefix)
    try:
        config = published_pool(store, prefix)
        try:
            pool = Pool.from_dict(config)
        except SchedulerError as exc:
            raise click.ClickException(f"the stored pool is invalid: {exc}") from None
        allocs = decoded_allocations(store)
        nodes = store.nodes()
        admin = store.node_admin()
    finally:
        store.close()
    from scheduler.service.nodes import node_statuses

    now = time.time()
    alive = {}
    for name, info in nodes.items():
        try:
            hb = float(info.get("heartbeat_at", "nan"))
        except ValueError:
            hb = math.nan
        alive[name] = math.isfinite(hb) and now - hb <= heartbeat_s
    # What a worker found wrong with its node (MIG layout, MPS daemon): it takes no work.
    refusing = {n: info["refuse"] for n, info in nodes.items() if info.get("refuse")}
    statuses = node_statuses(
        [n.name for n in pool.nodes], nodes, admin, now=now, stale_s=heartbeat_s
    )
    held = {a.get("option", {}).get("node") for a in allocs.values()}
    states = {n: node_state_label(st.liveness, st.admin, n in held) for n, st in statuses.items()}
    if out.json:
        from scheduler.cli._render_host import host_by_node
        from scheduler.cli.render import free_by_type

        out.emit_json(
            {
                "name": pool.name,
                "allocations": allocs,
                "nodes_alive": alive,
                "node_states": states,
                "free_by_type": free_by_type(pool, allocs),
                "host_by_node": host_by_node(pool, allocs),
                "nodes_refusing": refusing,
            }
        )
        return
    view = pool_view(
        pool,
        allocs,
        nodes_alive=alive if nodes else None,
        node_states=states,
        group_rows=out.format != "tsv",
    )
    notes = [f"node {name} refuses work: {why}" for name, why in sorted(refusing.items())]
    out.print([view, *notes])


def node_state_label(liveness: str, admin: str | None, busy: bool) -> str:
    """What ``snugfit pool`` shows for a node: up / down / unknown, and the operator state."""
    if admin is None:
        return liveness
    shown = "drained" if admin == "draining" and not busy else admin
    return f"{liveness}, {shown}"
