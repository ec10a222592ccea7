"""The job page's data: the ``snugfit explain`` view of one job as table rows.

The candidates table lists every option the scheduler weighed in the order and with the
status words of :func:`scheduler.cli.render.decision_table` (chosen first, then the options
that fit now by cost, then those that fit an empty pool, then the rest); the VRAM breakdown is
the prediction on the chosen GPU type (else the first type predicted), and predicted against
actual compares the chosen option with the measured outcome. ``cli_text`` is what
``snugfit explain`` prints, rendered by the same function.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

from predictor.gpus import GPU_NAMES
from scheduler.cli.ops import parse_record
from scheduler.cli.render import (
    BREAKDOWN_ORDER,
    explain,
    fmt_duration,
    fmt_gib,
    fmt_usd,
    pending_reason,
)
from scheduler.core.decision import Decision, Option
from scheduler.dashboard.pending import DERIVED_POLICY, pending_decisions
from scheduler.dashboard.reads import newest_events
from scheduler.exceptions import SchedulerError

__all__ = ["decision_rows", "job_data"]

#: Events scanned (newest first) for the job's own placement-log lines.
EVENT_SCAN = 2000
_LOG_TAIL_CHARS = 4000
_CLI_WIDTH = 220


def job_data(store: Any, job_id: str) -> dict[str, Any] | None:
    """Everything the job page shows (also ``/api/job/{id}``); None when there is no such job."""
    raw = store.get_job(job_id)
    if raw is None:
        return None
    rec = parse_record(raw)
    state = str(rec.get("state") or "?")
    spec: dict[str, Any] = rec["spec"] if isinstance(rec.get("spec"), dict) else {}
    decision, decision_error = _decision(rec)
    if decision is None and state == "pending" and decision_error is None:
        decision = pending_decisions(store, [job_id]).get(job_id)
    preds = rec.get("predictions") if isinstance(rec.get("predictions"), dict) else None
    outcome = rec.get("outcome") if isinstance(rec.get("outcome"), dict) else None
    chosen = decision.chosen_option if decision is not None else None
    model = spec.get("model")
    waiting = state in ("pending", "rejected") or (
        decision is not None and decision.state != "placed"
    )
    return {
        "id": job_id,
        "state": state,
        "attempt": rec.get("attempt"),
        "model": model.get("name") if isinstance(model, dict) else model,
        "task": spec.get("task"),
        "n_gpus": spec.get("n_gpus", 1),
        "user": rec.get("user") or spec.get("user"),
        "team": rec.get("team") or spec.get("team"),
        "method": rec.get("method"),
        "simulated": bool(rec.get("simulated")),
        "reason": str(rec.get("reason") or ""),
        "pending_reason": pending_reason(decision, state) if waiting else None,
        "decision": None if decision is None else _decision_view(decision),
        "decision_derived": decision is not None and decision.policy == DERIVED_POLICY,
        "decision_error": decision_error,
        "breakdown": _breakdown(preds, chosen),
        "predicted_vs_actual": _vs_actual(chosen, outcome),
        "outcome": outcome,
        "events": _job_events(store, job_id),
        "logs_tail": store.logs(job_id)[-_LOG_TAIL_CHARS:],
        "cli_text": _cli_text({**rec, "spec": spec}, decision, preds, outcome),
    }


def _job_events(store: Any, job_id: str) -> list[dict[str, Any]]:
    """The job's events among the newest ``EVENT_SCAN``, in time order: processes append with
    their own clocks, so a worker's ``started`` can enter the stream before its ``placed``."""
    mine = [e for _, e in newest_events(store, EVENT_SCAN) if e.get("job_id") == job_id]
    return sorted(mine, key=lambda e: e["ts"] if isinstance(e.get("ts"), int | float) else 0.0)


def _decision(rec: Mapping[str, Any]) -> tuple[Decision | None, str | None]:
    raw = rec.get("decision")
    if not isinstance(raw, dict):
        return None, None
    try:
        return Decision.from_dict(raw), None
    except (SchedulerError, KeyError, TypeError, ValueError) as exc:
        return None, f"the stored decision is unreadable: {exc}"


def _decision_view(d: Decision) -> dict[str, Any]:
    return {
        "job_id": d.job_id,
        "state": d.state,
        "policy": d.policy,
        "reason": d.reason,
        "n_options": len(d.options),
        "rows": decision_rows(d),
    }


def _order(d: Decision) -> list[int]:
    # The CLI table's order (scheduler.cli.render.decision_table); a test holds the two equal.
    def key(i: int) -> tuple[int, float, str]:
        o = d.options[i]
        rank = 0 if i == d.chosen else (1 if o.fits_now else (2 if o.fits_empty else 3))
        return (rank, o.cost_usd if o.cost_usd is not None else math.inf, o.label)

    return sorted(range(len(d.options)), key=key)


def decision_rows(d: Decision) -> list[dict[str, Any]]:
    """Every option of ``d`` as a row of the explain table, with its formatted cells."""
    rows = []
    for i in _order(d):
        o = d.options[i]
        kind, status = _status(d, i, o)
        rows.append(
            {
                "chosen": i == d.chosen,
                "runner_up": i == d.runner_up,
                "label": o.label,
                "where": _where(o),
                "vram_gib": fmt_gib(o.vram_gib),
                "vram_upper_gib": fmt_gib(o.vram_upper_gib),
                "reserve_cap_gib": f"{fmt_gib(o.reserved_gib)}/{fmt_gib(o.capacity_gib)}",
                "runtime": fmt_duration(o.runtime_s),
                "cost": fmt_usd(o.cost_usd),
                "cost_usd": o.cost_usd,
                "status": status,
                "status_kind": kind,
            }
        )
    return rows


def _status(d: Decision, i: int, o: Option) -> tuple[str, str]:
    if i == d.chosen:
        return "chosen", "CHOSEN"
    if o.fits_now:
        tag = "FITS (runner-up)" if i == d.runner_up else "FITS"
        return "fits", f"{tag}: {o.reason}" if o.reason else tag
    if o.fits_empty:
        return "busy", o.reason or "busy now"
    return "nofit", o.reason or "does not fit"


def _where(o: Option) -> str:
    if not o.node:
        return ""
    gpus = ",".join(str(g) for g in o.gpu_indices)
    slot = f"@{o.mig_start}" if o.kind == "mig" and o.mig_start is not None else ""
    return f"{o.node}[{gpus}]{slot}"


def _breakdown(preds: Mapping[str, Any] | None, chosen: Option | None) -> dict[str, Any] | None:
    if not preds:
        return None
    gpu = chosen.gpu_type if chosen is not None else None
    if gpu is None or gpu not in preds:
        gpu = next((g for g in GPU_NAMES if g in preds), None)
    pred = preds.get(gpu) if gpu is not None else None
    if not isinstance(pred, dict) or not pred.get("breakdown_gib"):
        return None
    b = pred["breakdown_gib"]
    values = {k: float(b.get(k) or 0.0) for k in BREAKDOWN_ORDER}
    values.update({k: float(v or 0.0) for k, v in b.items() if k not in values})
    total = sum(values.values())
    cap = chosen.capacity_gib if chosen is not None else None
    scale = max(cap or 0.0, total, 1e-9)
    return {
        "gpu": gpu,
        "method": pred.get("method"),
        "capacity_gib": cap,
        "total_gib": round(total, 3),
        "peak_vram_upper_gib": pred.get("peak_vram_upper_gib"),
        "rows": [
            {
                "component": k,
                "gib": round(v, 3),
                "share": v / total if total > 0 else None,
                "bar_frac": v / scale,
            }
            for k, v in values.items()
        ],
    }


def _vs_actual(chosen: Option | None, outcome: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if chosen is None or not outcome:
        return None
    peak = outcome.get("peak_vram_gib")
    rt = outcome.get("runtime_s")
    return {
        "simulated": bool(outcome.get("simulated")),
        "oom": bool(outcome.get("oom")),
        "rows": [
            {
                "what": "peak VRAM GiB",
                "predicted": fmt_gib(chosen.vram_gib),
                "upper": fmt_gib(chosen.vram_upper_gib),
                "reserved": fmt_gib(chosen.reserved_gib),
                "actual": fmt_gib(peak),
                "ratio": _ratio(peak, chosen.vram_gib),
            },
            {
                "what": "runtime",
                "predicted": fmt_duration(chosen.runtime_s),
                "upper": "-",
                "reserved": "-",
                "actual": fmt_duration(rt),
                "ratio": _ratio(rt, chosen.runtime_s),
            },
        ],
    }


def _ratio(actual: Any, predicted: float | None) -> str:
    if not isinstance(actual, int | float) or predicted is None or not predicted > 0:
        return "-"
    return f"{actual / predicted:.2f}x"


def _cli_text(
    rec: Mapping[str, Any],
    decision: Decision | None,
    preds: Mapping[str, Any] | None,
    outcome: Mapping[str, Any] | None,
) -> str:
    """What ``snugfit explain ID`` prints, as plain text."""
    from rich.console import Console

    console = Console(width=_CLI_WIDTH, record=True, file=io.StringIO(), color_system=None)
    try:
        console.print(explain(rec, decision, predictions=preds, outcome=outcome))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # A field someone else wrote in a shape snugfit never writes: the tables above, built
        # from the validated parts, still show; only this text view gives up.
        return f"(the record does not render as `snugfit explain` text: {exc})"
    return console.export_text()
