"""Operator-facing rendering: decisions, VRAM breakdowns, placement-log lines and the pool view.

Everything here is pure: records in (plain dicts as stored in Redis, :class:`Decision`,
:class:`Pool`), rich renderables or strings out. ``snugfit explain / log / pool`` and the demo do
the I/O; tests render without a terminal.

The candidates table follows SkyPilot's optimizer output (every option considered, the chosen
one marked); "why pending" follows Slurm's ``Reason=`` codes with a Kueue-style message after it.

The pool view (:func:`pool_view`, :func:`free_by_type`) lives in :mod:`scheduler.cli._render_pool`
and is re-exported here, so ``scheduler.cli.render`` stays the one import for every view.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from predictor.gpus import GPU_NAMES
from predictor.prediction import BREAKDOWN_KEYS
from scheduler.cli._render_host import host_line
from scheduler.cli._render_pool import free_by_type, pool_view
from scheduler.core.decision import Decision, Option

__all__ = [
    "BREAKDOWN_ORDER",
    "COMPARISON_ROWS",
    "breakdown_table",
    "comparison_table",
    "decision_table",
    "event_line",
    "explain",
    "fmt_duration",
    "fmt_gib",
    "fmt_metric",
    "fmt_usd",
    "free_by_type",
    "option_label",
    "pending_reason",
    "pool_view",
    "predicted_vs_actual_table",
]

# The Prediction contract's own order, so the bars can never miss a component.
BREAKDOWN_ORDER: tuple[str, ...] = BREAKDOWN_KEYS
_BAR_WIDTH_CHARS = 24
_MAX_OPTION_ROWS = 40


# ---------------------------------------------------------------------------------------------
# number formatting (one place, so every view agrees)


def fmt_gib(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}"


def fmt_usd(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"${x:,.2f}" if x < 1000 else f"${x:,.0f}"


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``12m05s``, ``3h07m``, ``2d04h``: short enough for a table cell."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(float(seconds), 0.0)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def _fmt_ts(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def option_label(opt: Mapping[str, Any] | Option | None) -> str:
    """``H100-80GB x2``, ``A100-80GB MIG 3g.40gb``, ``H100-80GB shared`` (from a dict or Option)."""
    if opt is None:
        return "-"
    o = opt.to_dict() if isinstance(opt, Option) else opt
    kind = o.get("kind")
    gpu = o.get("gpu_type", "?")
    if kind == "mig":
        return f"{gpu} MIG {o.get('mig_profile')}"
    if kind == "shared":
        return f"{gpu} shared"
    n_nodes = o.get("n_nodes") or 1
    if n_nodes > 1:
        return f"{gpu} x{o.get('n_gpus', 1)} ({n_nodes} nodes)"
    return f"{gpu} x{o.get('n_gpus', 1)}"


def _where(o: Mapping[str, Any]) -> str:
    node = o.get("node")
    if not node:
        return ""
    gpus = ",".join(str(g) for g in o.get("gpu_indices") or ())
    n_nodes = o.get("n_nodes") or 1
    if n_nodes > 1:
        # A multi-node gang: its rendezvous master's node, and how many more it spans.
        others = n_nodes - 1
        return f"{node} +{others} node{'s' if others > 1 else ''}[{gpus}]"
    start = o.get("mig_start")
    slot = f"@{start}" if o.get("kind") == "mig" and start is not None else ""
    return f"{node}[{gpus}]{slot}"


# ---------------------------------------------------------------------------------------------
# explain: candidates table, breakdown, predicted vs actual, why pending


def _option_order(d: Decision) -> list[int]:
    """Chosen first, then options that fit now by cost, then the rest by cost."""

    def key(i: int) -> tuple[int, float, str]:
        o = d.options[i]
        rank = 0 if i == d.chosen else (1 if o.fits_now else (2 if o.fits_empty else 3))
        cost = o.cost_usd if o.cost_usd is not None else math.inf
        return (rank, cost, o.label)

    return sorted(range(len(d.options)), key=key)


def _status(d: Decision, i: int) -> Text:
    o = d.options[i]
    if i == d.chosen:
        return Text("CHOSEN", style="bold green")
    if o.fits_now:
        tag = "FITS (runner-up)" if i == d.runner_up else "FITS"
        text = Text(tag, style="green")
        if o.reason:
            text.append(f": {o.reason}", style="dim")
        return text
    style = "yellow" if o.fits_empty else "red"
    return Text(o.reason or ("busy now" if o.fits_empty else "does not fit"), style=style)


def decision_table(decision: Decision, *, max_rows: int = _MAX_OPTION_ROWS) -> Table:
    """SkyPilot-optimizer-style table: every option considered, the chosen one marked."""
    title = f"{decision.job_id}: {decision.state} by policy {decision.policy}"
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("", width=1, no_wrap=True)
    table.add_column("option", no_wrap=True)
    table.add_column("where", no_wrap=True)
    table.add_column("VRAM GiB", justify="right", no_wrap=True)
    table.add_column("upper", justify="right", no_wrap=True)
    table.add_column("reserve/cap GiB", justify="right", no_wrap=True)
    table.add_column("runtime", justify="right", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    table.add_column("status / why it lost")
    order = _option_order(decision)
    for n, i in enumerate(order):
        if n >= max_rows:
            table.add_row("", Text(f"... {len(order) - max_rows} more options", style="dim"))
            break
        o = decision.options[i]
        chosen = i == decision.chosen
        table.add_row(
            "✔" if chosen else "",
            o.label,
            _where(o.to_dict()),
            fmt_gib(o.vram_gib),
            fmt_gib(o.vram_upper_gib),
            f"{fmt_gib(o.reserved_gib)}/{fmt_gib(o.capacity_gib)}",
            fmt_duration(o.runtime_s),
            fmt_usd(o.cost_usd),
            _status(decision, i),
            style="bold" if chosen else None,
        )
    return table


def breakdown_table(
    breakdown_gib: Mapping[str, float], *, capacity_gib: float | None = None, title: str = ""
) -> Table:
    """Per-component predicted VRAM (per GPU) with a bar scaled to the total or the slot."""
    values = {k: float(breakdown_gib.get(k, 0.0) or 0.0) for k in BREAKDOWN_ORDER}
    for k, v in breakdown_gib.items():
        if k not in values:
            values[k] = float(v or 0.0)
    total = sum(values.values())
    scale = max(capacity_gib or 0.0, total, 1e-9)
    table = Table(title=title or "predicted VRAM breakdown (per GPU)", title_justify="left")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    for k, v in values.items():
        bar = "█" * round(_BAR_WIDTH_CHARS * v / scale)
        share = f"{v / total:.0%}" if total > 0 else "-"
        table.add_row(k, f"{v:.2f}", share, Text(bar, style="cyan"))
    cap = "" if capacity_gib is None else f" of {capacity_gib:.1f} GiB slot"
    table.add_row(Text("total", style="bold"), Text(f"{total:.2f}", style="bold"), "", cap)
    return table


def predicted_vs_actual_table(option: Option, outcome: Mapping[str, Any]) -> Table:
    """Once a job ran: predicted point / upper / reserved against the measured peak and time."""
    sim = " (simulated run)" if outcome.get("simulated") else ""
    table = Table(title=f"predicted vs actual{sim}", title_justify="left")
    table.add_column("")
    table.add_column("predicted", justify="right")
    table.add_column("upper", justify="right")
    table.add_column("reserved", justify="right")
    table.add_column("actual", justify="right")
    table.add_column("actual/predicted", justify="right")
    peak = outcome.get("peak_vram_gib")
    rt = outcome.get("runtime_s")
    table.add_row(
        "peak VRAM GiB",
        fmt_gib(option.vram_gib),
        fmt_gib(option.vram_upper_gib),
        fmt_gib(option.reserved_gib),
        fmt_gib(peak),
        _ratio(peak, option.vram_gib),
    )
    table.add_row(
        "runtime",
        fmt_duration(option.runtime_s),
        "-",
        "-",
        fmt_duration(rt),
        _ratio(rt, option.runtime_s),
    )
    return table


def _ratio(actual: float | None, predicted: float | None) -> str:
    if actual is None or predicted is None or not predicted > 0:
        return "-"
    return f"{actual / predicted:.2f}x"


# Slurm's squeue Reason codes, picked by what blocks the job's cheapest option.
_REASON_CODES: tuple[tuple[str, str], ...] = (
    ("fits nowhere", "PartitionConfig"),
    ("pinned to", "ReqNodeNotAvail"),
    ("no prediction", "PartitionConfig"),
    ("held back by the policy", "Priority"),
    ("waiting for", "Priority"),
    ("insufficient", "Resources"),
    ("max_shared_jobs", "Resources"),
    ("GiB free", "Resources"),
)


def pending_reason(decision: Decision | None, state: str | None = None) -> str:
    """Slurm ``Reason=`` code plus a Kueue-style message for a job that is not running.

    e.g. ``Reason=Resources: insufficient free A100-80GB: 2 more needed (cheapest option
    A100-80GB x4 $12.40; 3 options fit an empty pool)``.
    """
    if decision is None:
        if state == "pending":
            return "Reason=None: not yet considered by the scheduler (is `snugfit scheduler` up?)"
        return f"Reason=None: job is {state or 'unknown'}"
    text = decision.reason.removeprefix("waiting: ")
    code = "Resources" if decision.state == "pending" else "None"
    for needle, c in _REASON_CODES:
        if needle in decision.reason:
            code = c
            break
    if decision.state == "rejected":
        code = "PartitionConfig"
    tail = ""
    if decision.state == "pending" and decision.options:
        empty = [o for o in decision.options if o.fits_empty]
        if empty:
            best = min(empty, key=lambda o: o.cost_usd if o.cost_usd is not None else math.inf)
            tail = (
                f" (cheapest option {best.label} {fmt_usd(best.cost_usd)}; "
                f"{len(empty)} option{'s' if len(empty) != 1 else ''} fit an empty pool)"
            )
    return f"Reason={code}: {text}{tail}"


def explain(
    job: Mapping[str, Any],
    decision: Decision | None,
    *,
    predictions: Mapping[str, Mapping[str, Any]] | None = None,
    outcome: Mapping[str, Any] | None = None,
) -> RenderableType:
    """Everything ``snugfit explain`` prints for one job record (already parsed)."""
    parts: list[RenderableType] = []
    state = str(job.get("state", "?"))
    spec = job.get("spec")
    if not isinstance(spec, dict):  # a hand-written record: show what can be shown
        spec = {}
    model = spec.get("model")
    model_name = model.get("name") if isinstance(model, dict) else model
    head = Text()
    head.append(f"job {job.get('id')}", style="bold")
    head.append(f"  state={state}  attempt={job.get('attempt', 0)}")
    if model_name:
        head.append(f"  model={model_name} task={spec.get('task')} n_gpus={spec.get('n_gpus', 1)}")
    if job.get("method"):
        head.append(f"  method={job.get('method')}")
    if job.get("simulated"):
        head.append("  [simulated]", style="magenta")
    parts.append(head)
    if decision is not None:
        parts.append(Text(f"decision: {decision.reason}"))
        parts.append(decision_table(decision))
        if (line := host_line(decision.chosen_option)) is not None:
            parts.append(line)
    held = str(job.get("reason") or "")
    if state == "pending" and held.startswith(("JobHeldUser", "Dependency")):
        # Held by a user or a parent (scripts/workflow.lua): the scheduler has not seen it.
        parts.append(Text(f"Reason={held}", style="yellow"))
    elif state in ("pending", "rejected") or (decision is not None and decision.state != "placed"):
        parts.append(Text(pending_reason(decision, state), style="yellow"))
    if job.get("reason") and state not in ("pending",):
        parts.append(Text(f"reason: {job.get('reason')}"))
    chosen = decision.chosen_option if decision is not None else None
    gpu = chosen.gpu_type if chosen is not None else None
    if predictions:
        if gpu is None or gpu not in predictions:
            gpu = next((g for g in GPU_NAMES if g in predictions), None)
        pred = predictions.get(gpu) if gpu is not None else None
        if pred and pred.get("breakdown_gib"):
            cap = chosen.capacity_gib if chosen is not None else None
            title = f"predicted VRAM breakdown on {gpu} (per GPU, {pred.get('method', '?')})"
            parts.append(breakdown_table(pred["breakdown_gib"], capacity_gib=cap, title=title))
    if outcome and chosen is not None:
        parts.append(predicted_vs_actual_table(chosen, outcome))
        if outcome.get("oom"):
            parts.append(Text("the last attempt was OOM-killed", style="red"))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# placement log


def event_line(event: Mapping[str, Any]) -> str:
    """One placement-log event as one human-readable line (see ``scheduler.service.store.keys``).

    A malformed entry (anyone who can write to Redis can append one) prints as what it is
    instead of raising, so one bad entry never stops ``snugfit log`` or the dashboard.
    """
    try:
        return _event_line(event)
    except (TypeError, ValueError, AttributeError, KeyError):
        raw = repr(dict(event))
        return (
            f"{event.get('event', '?')!s:<9}  {event.get('job_id') or '-'}  malformed: {raw:.200}"
        )


def _event_line(event: Mapping[str, Any]) -> str:
    kind = str(event.get("event", "?"))
    jid = event.get("job_id") or "-"
    attempt = event.get("attempt")
    who = f"{jid}#{attempt}" if attempt is not None else str(jid)
    parts = [_fmt_ts(event.get("ts")), f"{kind:<9}", who]
    opt = event.get("option")
    if opt:
        where = _where(opt)
        parts.append(f"-> {option_label(opt)}" + (f" on {where}" if where else ""))
    elif event.get("node"):
        parts.append(f"on {event.get('node')}")
    if event.get("cost_usd") is not None:
        parts.append(f"cost {fmt_usd(event.get('cost_usd'))}")
    ru = event.get("runner_up")
    if ru:
        parts.append(f"runner-up {option_label(ru)} {fmt_usd(ru.get('cost_usd'))}")
    out = event.get("outcome")
    if out:
        bits = []
        if out.get("peak_vram_gib") is not None:
            bits.append(f"peak {fmt_gib(out.get('peak_vram_gib'))} GiB")
        if out.get("runtime_s") is not None:
            bits.append(f"ran {fmt_duration(out.get('runtime_s'))}")
        if out.get("exit_code") is not None:
            bits.append(f"exit {out.get('exit_code')}")
        if out.get("oom"):
            bits.append("OOM")
        if bits:
            parts.append(", ".join(bits))
    if event.get("policy"):
        parts.append(f"policy={event.get('policy')}")
    if event.get("method"):
        parts.append(f"method={event.get('method')}")
    if kind == "retrain":  # started / accepted / rejected, and the version it installed
        parts.append(str(event.get("phase", "?")))
        if event.get("version"):
            parts.append(f"version={event.get('version')}")
    if event.get("reason"):
        parts.append(f"| {event.get('reason')}")
    if event.get("simulated"):
        parts.append("[sim]")
    return "  ".join(parts)


# ---------------------------------------------------------------------------------------------
# demo summary


COMPARISON_ROWS: tuple[tuple[str, str, str], ...] = (
    ("n_finished", "jobs finished", "{:,.0f}"),
    ("cost_usd", "cost (USD)", "${:,.0f}"),
    ("gpu_hours", "GPU-hours", "{:,.0f}"),
    ("reserved_over_actual_median", "reserved / actual VRAM p50", "{:.2f}x"),
    ("reserved_over_actual_p95", "reserved / actual VRAM p95", "{:.2f}x"),
    ("smallest_fit_rate", "smallest-fit rate", "{:.0%}"),
    ("oom_kills", "OOM kills", "{:,.0f}"),
    ("jobs_predicted_from_history", "jobs answered by history", "{:,.0f}"),
    ("oom_kills_history", "OOM kills among them", "{:,.0f}"),
    ("queue_delay_p50_s", "queueing delay p50", "dur"),
    ("queue_delay_p95_s", "queueing delay p95", "dur"),
    ("jct_p50_s", "JCT p50", "dur"),
    ("n_rejected", "rejected", "{:,.0f}"),
)


def comparison_table(
    columns: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    title: str = "",
    rows: Iterable[tuple[str, str, str]] = COMPARISON_ROWS,
) -> Table:
    """Metrics side by side, one column per run (e.g. live snugfit vs simulated baseline)."""
    table = Table(title=title or None, title_justify="left")
    table.add_column("metric")
    for head, _ in columns:
        table.add_column(head, justify="right")
    for key, label, fmt in rows:
        table.add_row(label, *(fmt_metric(m.get(key), fmt) for _, m in columns))
    return table


def fmt_metric(v: Any, fmt: str) -> str:
    """One cell of a comparison: "-" when missing or not finite, a duration for "dur"."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if fmt == "dur":
        return fmt_duration(float(v))
    return fmt.format(v)
