"""The report's serving section: per deployment, the latency-throughput frontier of each GPU
type and its $ per 1M output tokens (issue 15 item 6), as inline SVG like the rest of the report.

The data is :func:`predictor.serving.plan_frontiers`: for the cheapest option meeting the SLO on
each GPU type, output tokens/s per GPU against p95 TPOT from light load to saturation. Every
figure is predicted by the analytical serving model, not measured, and the section says so.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEMO_DEPLOYMENTS", "demo_serving_html", "frontier_svg", "serving_html", "usd_svg"]

#: The two deployments the demo report charts: an 8B chat and a 70B deployment (also measured
#: by benchmarks/bench_plan.py).
DEMO_DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "chat-8b": {
        "model": "llama-3.1-8b",
        "task": "serve",
        "request_rate": 2.0,
        "input_len": 512,
        "output_len": 256,
        "slo_ttft_s": 0.5,
        "slo_tpot_s": 0.05,
    },
    "llama-70b": {
        "model": "llama-3.3-70b",
        "task": "serve",
        "request_rate": 20.0,
        "input_len": 1024,
        "output_len": 256,
        "allowed_weight_dtypes": ["bf16", "fp8"],
    },
}

_W, _H = 1100, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 230, 20, 45
_COLOURS = {
    "A100-40GB": "#9ecae1",
    "A100-80GB": "#3182bd",
    "H100-80GB": "#31a354",
    "H200-141GB": "#e6550d",
    "B200-180GB": "#756bb1",
}


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _gpu_type(where: str) -> str:
    return where.split(" MIG ", 1)[0]


def per_gpu_type(frontiers: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The cheapest entry per catalogue GPU type (``plan_frontiers`` keys MIG slices apart)."""
    best: dict[str, Mapping[str, Any]] = {}
    for where, f in frontiers.items():
        t = _gpu_type(where)
        if f["points"] and (
            t not in best or f["usd_per_million_tokens"] < best[t]["usd_per_million_tokens"]
        ):
            best[t] = f
    return best


def frontier_svg(curves: Mapping[str, Mapping[str, Any]], slo_tpot_s: float | None) -> str:
    """One polyline per GPU type: output tok/s per GPU (x) against p95 TPOT in ms (y)."""
    pts = [p for c in curves.values() for p in c["points"]]
    if not pts:
        return '<p class="note">no option meets the SLO on any GPU type</p>'
    x_top = max(p["tok_s_per_gpu"] for p in pts) * 1.05 or 1.0
    y_vals = [p["tpot_p95_s"] * 1e3 for p in pts] + ([slo_tpot_s * 1e3] if slo_tpot_s else [])
    y_top = max(y_vals) * 1.1 or 1.0
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def xy(x: float, y: float) -> tuple[float, float]:
        return _LEFT + pw * x / x_top, _TOP + ph * (1 - y / y_top)

    parts = [
        f'<svg class="chart frontier" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
        f'height="{_H}" role="img" aria-label="Latency-throughput frontier per GPU type">',
        f'<line x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}" stroke="#555"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}" stroke="#555"/>',
        f'<text x="{_LEFT + pw / 2}" y="{_H - 8}" font-size="12" text-anchor="middle">'
        "output tokens/s per GPU (predicted)</text>",
        f'<text x="14" y="{_TOP + ph / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {_TOP + ph / 2})">p95 TPOT, ms</text>',
    ]
    for k in range(6):
        xv, yv = x_top * k / 5, y_top * k / 5
        x, _ = xy(xv, 0)
        _, y = xy(0, yv)
        parts.append(
            f'<text x="{x:.1f}" y="{_TOP + ph + 15}" font-size="10" text-anchor="middle">'
            f"{xv:,.0f}</text>"
            f'<text x="{_LEFT - 5}" y="{y + 3:.1f}" font-size="10" text-anchor="end">'
            f"{yv:.0f}</text>"
        )
    if slo_tpot_s:
        _, y = xy(0, slo_tpot_s * 1e3)
        parts.append(
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + pw}" y2="{y:.1f}" stroke="#d62728" '
            f'stroke-dasharray="5,4"/><text x="{_LEFT + pw - 4}" y="{y - 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="#d62728">SLO TPOT {slo_tpot_s * 1e3:.0f} ms</text>'
        )
    for k, (gpu, c) in enumerate(sorted(curves.items())):
        colour = _COLOURS.get(gpu, "#636363")
        coords = [xy(p["tok_s_per_gpu"], p["tpot_p95_s"] * 1e3) for p in c["points"]]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(
            f'<polyline class="curve" points="{path}" fill="none" stroke="{colour}" '
            f'stroke-width="2"><title>{_e(c["shape"])}</title></polyline>'
        )
        for x, y in coords:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')
        ly = _TOP + 14 + k * 18
        parts.append(
            f'<rect x="{_W - _RIGHT + 15}" y="{ly - 9}" width="12" height="12" fill="{colour}"/>'
            f'<text x="{_W - _RIGHT + 32}" y="{ly + 1}" font-size="11">{_e(c["shape"])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def usd_svg(curves: Mapping[str, Mapping[str, Any]]) -> str:
    """Horizontal bars of $ per 1M output tokens per GPU type at the planned rate."""
    from scheduler.cli.report import hbar_svg

    items = [
        (str(curves[gpu]["shape"]), v, f"{gpu}: ${v:.4f} per 1M tokens", f"${v:.3f} / 1M")
        for gpu, c in sorted(curves.items())
        if math.isfinite(v := float(c["usd_per_million_tokens"]))
    ]
    if not items:
        return ""
    aria = "$ per 1M output tokens per GPU type"
    return hbar_svg(
        items, css_class="usd", aria=aria, bar_h=22, gap=6, value_room_px=140, width_px=_W
    )


def serving_html(plans: Sequence[Any]) -> str:
    """The section for ``ServingPlan`` objects: a frontier chart and a $/1M chart per plan."""
    from predictor.serving import plan_frontiers

    if not plans:
        return ""
    out = [
        "<h2>Serving by SLO: latency-throughput frontier and $ per 1M tokens per GPU type</h2>",
        '<p class="note">Predicted by the analytical serving model (predictor/serving), not '
        "measured: per GPU type, the cheapest option that meets the SLO, swept from light load "
        "to saturation. $ per 1M output tokens is at the deployment's planned request rate.</p>",
    ]
    for p in plans:
        s = p.spec
        curves = per_gpu_type(plan_frontiers(p))
        out.append(
            f"<h3>{_e(s.id or s.model_name)}: {_e(s.model_name)} at {s.request_rate:g} req/s, "
            f"{s.input_len}/{s.output_len} tokens, p95 TTFT &le; {s.slo_ttft_s} s, "
            f"TPOT &le; {s.slo_tpot_s} s</h3>"
            f'<p class="note">chosen: {_e(p.reason)}</p>'
        )
        out.append(frontier_svg(curves, s.slo_tpot_s))
        out.append(usd_svg(curves))
    return "".join(out)


def demo_serving_html() -> str:
    """The section for :data:`DEMO_DEPLOYMENTS` (planned here, offline)."""
    from predictor.serving import plan
    from predictor.spec import parse_spec

    return serving_html([plan(parse_spec({"id": k, **v})) for k, v in DEMO_DEPLOYMENTS.items()])
