"""A self-contained HTML report of a run: Gantt chart, VRAM reserved vs used, cost by policy.

The charts are inline SVG written here in Python: no CDN, no JavaScript, no network, so the file
opens anywhere (and in a headless browser in CI). Inputs are plain rows (:class:`JobRow`) built
from live job records (:func:`rows_from_records`) or from anything else that knows when each job
ran where.
"""

from __future__ import annotations

import hashlib
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cli.ops import number

__all__ = [
    "JobRow",
    "ReportData",
    "render_report",
    "rows_from_records",
    "write_report",
]

_CHART_WIDTH_PX = 1100
_LABEL_WIDTH_PX = 150
_ROW_HEIGHT_PX = 16
_BAR_CHART_HEIGHT_PX = 260
_MAX_JOB_BARS = 400


@dataclass(frozen=True, slots=True)
class JobRow:
    """One attempt of one job: where it ran, when, and what it reserved vs really used.

    Times are seconds on one axis shared by every row (e.g. workload time since the run
    started). VRAM is per GPU in GiB. ``gpus`` are pool GPU indices; ``lanes`` of a MIG slice
    or shared GPU are assigned by the chart.
    """

    job_id: str
    gpu_type: str
    kind: str
    node: str
    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    reserved_gib: float
    predicted_gib: float | None = None
    actual_gib: float | None = None
    cost_usd: float | None = None
    state: str = "succeeded"
    label: str = ""


@dataclass
class ReportData:
    """Everything the report shows. ``summary`` columns are (heading, metrics mapping)."""

    title: str
    rows: Sequence[JobRow]
    gpu_labels: Mapping[int, str]
    cost_by_policy: Mapping[str, float]
    summary: Sequence[tuple[str, Mapping[str, Any]]] = ()
    notes: Sequence[str] = ()
    time_unit: str = "workload hours"
    time_divisor_s: float = 3600.0
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# building rows from live job records


def rows_from_records(
    records: Iterable[Mapping[str, Any]],
    *,
    t0: float,
    time_scale: float = 1.0,
) -> list[JobRow]:
    """Rows from parsed job records (``scheduler.service.store.keys`` fields, JSON fields already
    decoded).

    ``t0`` is the epoch time the run started; ``time_scale`` maps wall seconds to workload
    seconds (the demo runs accelerated). Jobs that never started are skipped.
    """
    out: list[JobRow] = []
    for rec in records:
        placement = rec.get("placement")
        started = number(rec.get("started_at"))
        if not isinstance(placement, Mapping) or started is None:
            continue
        finished = number(rec.get("finished_at"))
        outcome = rec.get("outcome") if isinstance(rec.get("outcome"), Mapping) else {}
        end = finished if finished is not None else number(rec.get("updated_at")) or started
        decision = rec.get("decision")
        chosen = _chosen_option(decision) if isinstance(decision, Mapping) else None
        out.append(
            JobRow(
                job_id=str(rec.get("id")),
                gpu_type=str(placement.get("gpu_type", "?")),
                kind=str(placement.get("kind", "whole")),
                node=str(placement.get("node", "?")),
                gpus=tuple(int(g) for g in placement.get("gpu_indices") or ()),
                start_s=(started - t0) * time_scale,
                end_s=(max(end, started) - t0) * time_scale,
                reserved_gib=float(placement.get("reserved_gib") or 0.0),
                predicted_gib=number(chosen.get("vram_gib")) if chosen else None,
                actual_gib=number(outcome.get("peak_vram_gib")) if outcome else None,
                cost_usd=number(placement.get("cost_usd")),
                state=str(rec.get("state", "?")),
                label=str(placement.get("label", "")),
            )
        )
    return out


def _chosen_option(decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
    idx = decision.get("chosen")
    opts = decision.get("options") or []
    if isinstance(idx, int) and 0 <= idx < len(opts) and isinstance(opts[idx], Mapping):
        return opts[idx]  # type: ignore[no-any-return]
    return None


# ---------------------------------------------------------------------------------------------
# SVG charts


def _colour(job_id: str) -> str:
    # Stable per job across charts and runs: hue from a hash of the id.
    h = int(hashlib.blake2s(job_id.encode(), digest_size=4).hexdigest(), 16)
    return f"hsl({h % 360},{55 + h % 25}%,{45 + (h >> 9) % 15}%)"


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _lanes(rows: Sequence[JobRow]) -> dict[tuple[int, int], int]:
    """(row index, gpu) -> lane, so jobs sharing one GPU (MIG, MPS) never overlap visually."""
    lanes: dict[tuple[int, int], int] = {}
    ends: dict[int, list[float]] = {}
    for i in sorted(range(len(rows)), key=lambda k: rows[k].start_s):
        r = rows[i]
        for g in r.gpus:
            free = ends.setdefault(g, [])
            lane = next((k for k, e in enumerate(free) if e <= r.start_s + 1e-9), None)
            if lane is None:
                lane = len(free)
                free.append(r.end_s)
            else:
                free[lane] = r.end_s
            lanes[(i, g)] = lane
    return lanes


def gantt_svg(
    rows: Sequence[JobRow],
    gpu_labels: Mapping[int, str],
    *,
    time_divisor_s: float = 3600.0,
    time_unit: str = "hours",
) -> str:
    """GPUs down, time across; one bar per job attempt per GPU, coloured by job."""
    gpus = sorted(gpu_labels)
    if not gpus:
        return _empty_svg("no GPUs")
    t_end = max((r.end_s for r in rows), default=1.0) or 1.0
    plot_w = _CHART_WIDTH_PX - _LABEL_WIDTH_PX - 20
    height = len(gpus) * _ROW_HEIGHT_PX + 40
    y_of = {g: 10 + k * _ROW_HEIGHT_PX for k, g in enumerate(gpus)}
    lanes = _lanes(rows)
    n_lanes: dict[int, int] = {}
    for (_, g), lane in lanes.items():
        n_lanes[g] = max(n_lanes.get(g, 0), lane + 1)
    parts = [
        f'<svg class="chart gantt" xmlns="http://www.w3.org/2000/svg" width="{_CHART_WIDTH_PX}" '
        f'height="{height}" viewBox="0 0 {_CHART_WIDTH_PX} {height}" role="img" '
        f'aria-label="Gantt chart of GPUs over time">'
    ]
    for k, g in enumerate(gpus):
        y = y_of[g]
        if k % 2 == 0:
            parts.append(
                f'<rect x="{_LABEL_WIDTH_PX}" y="{y}" width="{plot_w}" height="{_ROW_HEIGHT_PX}" '
                'fill="#f4f4f6"/>'
            )
        parts.append(
            f'<text x="{_LABEL_WIDTH_PX - 6}" y="{y + _ROW_HEIGHT_PX - 4}" text-anchor="end" '
            f'font-size="10">{_e(gpu_labels[g])}</text>'
        )
    for i, r in enumerate(rows):
        x0 = _LABEL_WIDTH_PX + plot_w * max(r.start_s, 0.0) / t_end
        w = max(plot_w * (r.end_s - r.start_s) / t_end, 1.0)
        for g in r.gpus:
            if g not in y_of:
                continue
            n = n_lanes.get(g, 1)
            h = (_ROW_HEIGHT_PX - 2) / n
            y_bar = y_of[g] + 1 + lanes.get((i, g), 0) * h
            tip = (
                f"{r.job_id} on {r.label or r.gpu_type} ({r.node}) "
                f"{r.start_s / time_divisor_s:.2f}-{r.end_s / time_divisor_s:.2f} {time_unit}, "
                f"reserved {r.reserved_gib:.1f} GiB, {r.state}"
            )
            parts.append(
                f'<rect class="job" x="{x0:.1f}" y="{y_bar:.1f}" width="{w:.1f}" height="{h:.1f}" '
                f'fill="{_colour(r.job_id)}"><title>{_e(tip)}</title></rect>'
            )
    parts.append(_time_axis(t_end, plot_w, height - 26, time_divisor_s, time_unit))
    parts.append("</svg>")
    return "".join(parts)


def _time_axis(t_end: float, plot_w: float, y: float, divisor: float, unit: str) -> str:
    ticks = _nice_ticks(t_end / divisor)
    out = [
        f'<line x1="{_LABEL_WIDTH_PX}" y1="{y}" x2="{_LABEL_WIDTH_PX + plot_w}" y2="{y}" '
        'stroke="#555"/>'
    ]
    for v in ticks:
        x = _LABEL_WIDTH_PX + plot_w * (v * divisor) / t_end
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#555"/>')
        out.append(
            f'<text x="{x:.1f}" y="{y + 15}" font-size="10" text-anchor="middle">{v:g}</text>'
        )
    out.append(
        f'<text x="{_LABEL_WIDTH_PX + plot_w}" y="{y + 25}" font-size="10" '
        f'text-anchor="end">{_e(unit)}</text>'
    )
    return "".join(out)


def _nice_ticks(top: float, n: int = 8) -> list[float]:
    if not top > 0:
        return [0.0]
    raw = top / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(float(m) * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    k = int(top // step)
    return [round(i * step, 10) for i in range(k + 1)]


def vram_svg(rows: Sequence[JobRow]) -> str:
    """Per job: reserved VRAM (light bar) with the measured peak (dark) and prediction (tick)."""
    jobs = _last_attempts(rows)
    jobs.sort(key=lambda r: r.reserved_gib, reverse=True)
    jobs = jobs[:_MAX_JOB_BARS]
    if not jobs:
        return _empty_svg("no finished jobs")
    top = max(max(r.reserved_gib, r.actual_gib or 0.0, r.predicted_gib or 0.0) for r in jobs)
    top = top or 1.0
    left, bottom = 50, 30
    plot_w = _CHART_WIDTH_PX - left - 20
    plot_h = _BAR_CHART_HEIGHT_PX - bottom - 10
    bw = plot_w / len(jobs)
    parts = [
        f'<svg class="chart vram" xmlns="http://www.w3.org/2000/svg" width="{_CHART_WIDTH_PX}" '
        f'height="{_BAR_CHART_HEIGHT_PX}" role="img" '
        f'aria-label="VRAM reserved versus used per job">'
    ]
    for v in _nice_ticks(top, 5):
        y = 10 + plot_h * (1 - v / top)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{v:g}</text>'
        )
    for k, r in enumerate(jobs):
        x = left + k * bw
        hr = plot_h * r.reserved_gib / top
        parts.append(
            f'<rect class="reserved" x="{x:.2f}" y="{10 + plot_h - hr:.2f}" '
            f'width="{max(bw - 0.5, 0.5):.2f}" height="{hr:.2f}" fill="#9ecae1">'
            f"<title>{_e(r.job_id)}: reserved {r.reserved_gib:.1f} GiB on {_e(r.label)}, "
            f"used {_fmt(r.actual_gib)} GiB, predicted {_fmt(r.predicted_gib)} GiB</title></rect>"
        )
        if r.actual_gib is not None:
            ha = plot_h * min(r.actual_gib, top) / top
            parts.append(
                f'<rect class="used" x="{x + bw * 0.2:.2f}" y="{10 + plot_h - ha:.2f}" '
                f'width="{max(bw * 0.6, 0.5):.2f}" height="{ha:.2f}" fill="#08519c"/>'
            )
        if r.predicted_gib is not None:
            yp = 10 + plot_h * (1 - min(r.predicted_gib, top) / top)
            parts.append(
                f'<line class="predicted" x1="{x:.2f}" y1="{yp:.2f}" x2="{x + bw:.2f}" '
                f'y2="{yp:.2f}" stroke="#e6550d" stroke-width="1.5"/>'
            )
    parts.append(
        f'<text x="{left}" y="{_BAR_CHART_HEIGHT_PX - 8}" font-size="11">'
        f"{len(jobs)} jobs, largest reservation first. light: reserved, dark: measured peak, "
        "orange: predicted (GiB per GPU)</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _last_attempts(rows: Sequence[JobRow]) -> list[JobRow]:
    last: dict[str, JobRow] = {}
    for r in rows:
        if r.job_id not in last or r.start_s >= last[r.job_id].start_s:
            last[r.job_id] = r
    return list(last.values())


def cost_svg(cost_by_policy: Mapping[str, float]) -> str:
    """Horizontal bars of total cost per policy (the cheapest highlighted)."""
    items = [
        (name, v, f"{name}: ${v:,.2f}", f"${v:,.0f}")
        for name, v in cost_by_policy.items()
        if v is not None and math.isfinite(v)
    ]
    if not items:
        return _empty_svg("no costs")
    return hbar_svg(items, css_class="cost", aria="Cost by policy", bar_h=26, gap=8)


def hbar_svg(
    items: Sequence[tuple[str, float, str, str]],
    *,
    css_class: str,
    aria: str,
    bar_h: int,
    gap: int,
    value_room_px: int = 120,
    width_px: int = _CHART_WIDTH_PX,
) -> str:
    """Horizontal bars, one per ``(label, value, tooltip, value text)``, the smallest value
    highlighted; labels right-aligned in a 230 px margin."""
    top = max(v for _, v, _, _ in items) or 1.0
    cheapest = min(v for _, v, _, _ in items)
    left = 230
    height = len(items) * (bar_h + gap) + 2 * gap + 4
    plot_w = width_px - left - value_room_px
    parts = [
        f'<svg class="chart {css_class}" xmlns="http://www.w3.org/2000/svg" width="{width_px}" '
        f'height="{height}" role="img" aria-label="{_e(aria)}">'
    ]
    for k, (label, v, tooltip, text) in enumerate(items):
        y = gap + 2 + k * (bar_h + gap)
        w = max(plot_w * v / top, 1.0)
        fill = "#31a354" if v == cheapest else "#bdbdbd"
        ty = y + bar_h * 0.68
        parts.append(
            f'<text x="{left - 8}" y="{ty:.1f}" font-size="12" text-anchor="end">{_e(label)}'
            f'</text><rect class="bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" '
            f'fill="{fill}"><title>{_e(tooltip)}</title></rect>'
            f'<text x="{left + w + 6:.1f}" y="{ty:.1f}" font-size="12">{_e(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _empty_svg(text: str) -> str:
    return (
        '<svg class="chart empty" xmlns="http://www.w3.org/2000/svg" width="400" height="40">'
        f'<text x="10" y="25" font-size="12">{_e(text)}</text></svg>'
    )


# ---------------------------------------------------------------------------------------------
# the page


def _summary_html(summary: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    from scheduler.cli.render import COMPARISON_ROWS, fmt_metric

    if not summary:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h, _ in summary)
    body = []
    for key, label, fmt in COMPARISON_ROWS:
        cells = [f"<td>{_e(fmt_metric(m.get(key), fmt))}</td>" for _, m in summary]
        body.append(f"<tr><th>{_e(label)}</th>{''.join(cells)}</tr>")
    return (
        f'<table class="summary"><thead><tr><th>metric</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
table.summary{border-collapse:collapse;font-size:13px}
table.summary td,table.summary th{border:1px solid #ccc;padding:4px 10px;text-align:right}
table.summary thead th{background:#eee} table.summary tbody th{text-align:left}
.note{color:#555;font-size:13px} svg{display:block;margin:8px 0}
"""


def render_report(data: ReportData) -> str:
    """The whole HTML document as a string."""
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in data.notes)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(data.title)}</title>'
        f"<style>{_CSS}</style></head><body>"
        f"<h1>{_e(data.title)}</h1>{notes}"
        f"<h2>Summary</h2>{_summary_html(data.summary)}"
        "<h2>GPUs over time (coloured by job)</h2>"
        + gantt_svg(
            data.rows,
            data.gpu_labels,
            time_divisor_s=data.time_divisor_s,
            time_unit=data.time_unit,
        )
        + "<h2>VRAM reserved vs actually used, per job</h2>"
        + vram_svg(data.rows)
        + "<h2>Cost by policy (same workload)</h2>"
        + cost_svg(data.cost_by_policy)
        # Optional sections rendered elsewhere (scheduler.cli.report_serving), already HTML.
        + str(data.extra.get("serving_html", ""))
        + "</body></html>\n"
    )


def write_report(path: str | Path, data: ReportData) -> Path:
    """Write the report; returns the absolute path."""
    p = Path(path).resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_report(data), encoding="utf-8")
    return p
