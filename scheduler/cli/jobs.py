"""``snugfit queue | acct | hold | release | requeue``: the Slurm-style job commands (``squeue``,
``sacct``, ``scontrol hold / release / requeue``), thin wrappers over the client.

They follow the one output rule (:mod:`scheduler.cli.output`): on a terminal a plain table with
every column as wide as its widest cell (nothing is cut), in a pipe tab-separated lines with
``# `` comment lines, and ``--json`` typed values (numbers as numbers, times as epoch seconds,
null for unknown).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from scheduler.cli._options import client_for, redis_option
from scheduler.cli.output import Output, output_options

__all__ = [
    "acct_command",
    "hold_command",
    "queue_command",
    "release_command",
    "requeue_command",
    "text_table",
]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell (never truncated); the last one is not padded."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(r[:-1], widths[:-1], strict=True)]
        lines.append("  ".join([*cells, str(r[-1])]).rstrip())
    return "\n".join(lines)


def _emit_table(
    out: Output,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    above: Sequence[str] = (),
    below: Sequence[str] = (),
) -> None:
    """A table as the output rule wants it: padded columns, or tab-separated in a pipe with
    the notes ``above`` and ``below`` it as ``# `` lines."""
    if out.format == "tsv":
        tsv = ["\t".join(str(c).replace("\t", " ") for c in r) for r in [header, *rows]]
        click.echo("\n".join([*(f"# {n}" for n in above), *tsv, *(f"# {n}" for n in below)]))
        return
    click.echo("\n".join([*above, text_table(header, rows), *below]))


def _dur(x: float | None) -> str:
    from scheduler.cli.render import fmt_duration

    return fmt_duration(x)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _split(values: tuple[str, ...]) -> list[str] | None:
    out = [v for item in values for v in item.split(",") if v]
    return out or None


# ---------------------------------------------------------------------------------------------
# snugfit queue


def _owner_filters(f: Any) -> Any:
    """``-u/--user`` and ``--team`` (as ``users``, ``teams``): only jobs of these users or teams,
    repeated or comma-separated (:func:`_split`)."""
    users = click.option(
        "-u", "--user", "users", multiple=True, help="Only these users (repeat or a,b)."
    )
    teams = click.option("--team", "teams", multiple=True, help="Only these teams (repeat or a,b).")
    return users(teams(f))


@click.command("queue")
@click.argument("job_ids", nargs=-1)
@_owner_filters
@click.option(
    "-t",
    "--state",
    "states",
    multiple=True,
    help="Only these states (default: pending, placed, running; `all` for every state).",
)
@click.option("-w", "--node", "nodes", multiple=True, help="Only jobs placed on these nodes.")
@redis_option
@output_options(width=False, json_help="A JSON list of typed rows.")
def queue_command(
    job_ids: tuple[str, ...],
    users: tuple[str, ...],
    teams: tuple[str, ...],
    states: tuple[str, ...],
    nodes: tuple[str, ...],
    redis_url: str | None,
    out: Output,
) -> None:
    """List jobs like squeue: id, user, state, GPU option, node, elapsed, predicted time left
    and, for pending jobs, the reason (held, a dependency, or waiting for capacity)."""
    from scheduler.exceptions import SchedulerError
    from scheduler.service.store.keys import JobState

    want = _split(states)
    if want and "all" in want:
        want = [s.value for s in JobState]
    try:
        rows = client_for(redis_url).queue(
            job_ids=list(job_ids) or None,
            states=want,
            users=_split(users),
            teams=_split(teams),
            nodes=_split(nodes),
        )
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    if out.json:
        out.emit_json([r.to_dict() for r in rows])
        return
    header = ["JOBID", "USER", "TEAM", "STATE", "OPTION", "NODE", "ELAPSED", "PRED_LEFT", "REASON"]
    body = [
        [
            r.id,
            r.user or "-",
            r.team or "-",
            r.state.upper() + (" (held)" if r.held else ""),
            r.option or "-",
            r.node or "-",
            _dur(r.elapsed_s),
            _dur(r.remaining_s),
            r.reason or "",
        ]
        for r in rows
    ]
    _emit_table(out, header, body)


# ---------------------------------------------------------------------------------------------
# snugfit acct


def _ts(x: float | None) -> str:
    if x is None:
        return "-"
    return datetime.fromtimestamp(x, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _vs(actual: float | None, predicted: float | None, unit: str) -> str:
    if actual is None and predicted is None:
        return "-"
    if unit == "s":
        return f"{_dur(actual)}/{_dur(predicted)}"
    return f"{_num(actual, '.1f')}/{_num(predicted, '.1f')}"


@click.command("acct")
@click.argument("job_ids", nargs=-1)
@click.option("-S", "--since", default=None, help="From (ISO time, or ago: 30m, 2h, 1d, 1w).")
@click.option("-E", "--until", default=None, help="Until (ISO time, ago, or now).")
@click.option(
    "--by", type=click.Choice(["user", "team"]), default=None, help="Sum per user or team."
)
@_owner_filters
@redis_option
@output_options(width=False, json_help="Typed JSON: jobs, groups and total.")
def acct_command(
    job_ids: tuple[str, ...],
    since: str | None,
    until: str | None,
    by: str | None,
    users: tuple[str, ...],
    teams: tuple[str, ...],
    redis_url: str | None,
    out: Output,
) -> None:
    """Accounting like sacct, from the placement log: cost, GPU-hours, reserved and used VRAM,
    predicted against actual VRAM and runtime, per job or summed --by user|team, for attempts
    that ended in [--since, --until)."""
    from scheduler.exceptions import SchedulerError

    try:
        got = client_for(redis_url).acct(
            since=since,
            until=until,
            by=by,
            users=_split(users),
            teams=_split(teams),
            job_ids=list(job_ids) or None,
        )
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    if out.json:
        out.emit_json(got)
        return
    header, body, above, below = _acct_table(got)
    _emit_table(out, header, body, above, below)


def _acct_table(
    got: dict[str, Any],
) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """(header, rows, notes above, notes below): the window above, the total below."""
    t = got["total"]
    start = "the start of the log" if got["since"] is None else _ts(got["since"])
    window = f"attempts ended from {start} to {_ts(got['until'] or time.time())}"
    if got["by"]:
        header = [got["by"].upper(), "JOBS", "ATTEMPTS", "COST", "GPU_HOURS", "RESERVED_GiBh",
                  "USED_GiBh", "RES/USED", "RUNTIME", "PRED_RUNTIME"]  # fmt: skip
        body = [
            [
                g["key"],
                str(g["jobs"]),
                str(g["attempts"]),
                f"${g['cost_usd']:,.2f}",
                f"{g['gpu_hours']:.3f}",
                f"{g['reserved_gib_hours']:.2f}",
                f"{g['used_gib_hours']:.2f}",
                _num(g["reserved_over_used"], ".2f"),
                _dur(g["runtime_s"]),
                _dur(g["predicted_runtime_s"]),
            ]
            for g in [*got["groups"], t]
        ]
        return header, body, [window], []
    header = ["JOBID", "USER", "TEAM", "STATE", "ATT", "OPTION", "COST", "GPU_HOURS",
              "RESERVED_GiB", "PEAK/PRED_GiB", "RUNTIME/PRED", "ENDED"]  # fmt: skip
    body = [
        [
            j["id"] + (" [sim]" if j["simulated"] else ""),
            j["user"] or "-",
            j["team"] or "-",
            (j["state"] or "-").upper(),
            str(j["attempts"]),
            j["option"] or "-",
            f"${j['cost_usd']:,.4f}",
            f"{j['gpu_hours']:.4f}",
            _num(j["reserved_gib"], ".1f"),
            _vs(j["peak_vram_gib"], j["predicted_vram_gib"], "GiB"),
            _vs(j["runtime_s"], j["predicted_runtime_s"], "s"),
            _ts(j["ended_at"]),
        ]
        for j in got["jobs"]
    ]
    foot = (
        f"total: {t['jobs']} jobs, {t['attempts']} attempts, ${t['cost_usd']:,.2f}, "
        f"{t['gpu_hours']:.3f} GPU-hours"
    )
    return header, body, [window], [foot]


# ---------------------------------------------------------------------------------------------
# snugfit hold / release / requeue


_OK = {
    "hold": ("held", "already held"),
    "release": ("released",),
    "requeue": ("requeued", "requested"),
}


def _each(name: str, job_ids: tuple[str, ...], redis_url: str | None, out: Output) -> None:
    from scheduler.exceptions import SchedulerError

    try:
        got = getattr(client_for(redis_url), name)(list(job_ids))
    except SchedulerError as exc:
        raise click.ClickException(str(exc)) from None
    bad = 0
    rows: list[dict[str, Any]] = []
    for jid, answer in got.items():
        ok = answer in _OK[name]
        error = None if ok else _why(name, jid, answer)
        rows.append({"id": jid, "result": answer, "ok": ok, "error": error})
        if not ok:
            bad += 1
            if not out.json:
                click.echo(f"Error: {jid}: {error}", err=True)
        elif not out.json:
            click.echo(f"{jid}: {answer}")
    if out.json:
        out.emit_json(rows)
    if bad:
        raise SystemExit(1)


def _why(name: str, jid: str, answer: str) -> str:
    if answer == "missing":
        return "no such job; list jobs with `snugfit queue`"
    if answer.startswith("parent:"):
        _, parent, state = answer.split(":", 2)
        return (
            f"its parent {parent} is {state}, so it could never run; requeue {parent} first "
            f"(`snugfit requeue {parent} {jid}`)"
        )
    if name == "hold":
        return f"only a pending job can be held; it is {answer}"
    if name == "release":
        return "it is not held"
    return f"it is already {answer}; nothing to requeue"


def _each_command(name: str, help: str) -> click.Command:
    """``snugfit NAME ID...``: the client's ``NAME`` on each job, one result per id."""

    @click.command(name, help=help)
    @click.argument("job_ids", nargs=-1, required=True)
    @redis_option
    @output_options(table=False, json_help="A JSON list of {id, result, ok, error}.")
    def command(job_ids: tuple[str, ...], redis_url: str | None, out: Output) -> None:
        _each(name, job_ids, redis_url, out)

    return command


hold_command = _each_command("hold", "Keep pending jobs from being placed until `snugfit release`.")
release_command = _each_command(
    "release", "Let held jobs be placed again (they still wait for their dependencies)."
)
requeue_command = _each_command(
    "requeue",
    "Put jobs back to pending as a new attempt: a running one is stopped first; a finished, "
    "failed or cancelled one starts over.",
)
