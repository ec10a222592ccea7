"""`snugfit plan`: serving by SLO, offline, no Redis (the logic is ``predictor.serving``)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

import click

from predictor.exceptions import PredictorError
from predictor.gpus import GPU_NAMES
from predictor.serving import ServingPlan, plan
from predictor.spec import JobSpec, load_specs
from scheduler.cli._options import jobs_file_option
from scheduler.cli.output import Output, dumps_json, output_options, resolve_format

__all__ = ["contract_table", "plan_command", "plan_parts", "plan_title", "render_plan"]


def _s(x: float, unit: str = "s") -> str:
    if x != x or x == float("inf"):
        return "-"
    return f"{x * 1e3:.0f} ms" if unit == "ms" else f"{x:.3g} s"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def contract_table(
    title: str, options: list[dict[str, Any]], chosen: int | None, max_rows: int = 15
) -> Any:
    """The SkyPilot-style options table from ``snugfit plan --json`` option objects (the one
    rendering of a plan: live from the planner, or as a deployment stored it)."""
    from rich.table import Table

    t = Table(title=title)
    cols: tuple[str, ...] = ("#", "GPU", "TP", "weights/kv", "batch", "replicas", "max tok/s")
    cols += ("tok/s@SLO", "TTFT p95", "TPOT p95", "$/h", "$/1M tok", "Wh/1M", "cold", "status")
    for c in cols:
        t.add_column(c, justify="left" if c in ("GPU", "status", "weights/kv") else "right")
    for k, o in enumerate(options[:max_rows]):
        mark = "[bold green]" if k == chosen else ""
        where = o["gpu"] + (f" MIG {o['mig_profile']}" if o.get("mig_profile") else "")
        t.add_row(
            f"{mark}{k}",
            f"{mark}{where}",
            str(o["tensor_parallel"]),
            f"{o['weight_dtype']}/{o['kv_cache_dtype']}",
            str(o["max_batch"]),
            str(o["replicas"]) if o["replicas"] is not None else "-",
            _num(o["max_throughput_tok_s"], ",.0f"),
            _num(o["throughput_at_slo_tok_s"], ",.0f"),
            _s(o["ttft_p95_s"] if o["ttft_p95_s"] is not None else float("inf")),
            _s(o["tpot_p95_s"] if o["tpot_p95_s"] is not None else float("inf"), "ms"),
            _num(o["usd_per_hour"], ".2f"),
            _num(o["usd_per_million_tokens"], ".3f"),
            _num(o["wh_per_million_tokens"], ",.0f"),
            _num(o["cold_start_s"], ".0f") + " s",
            f"{mark}{o['status']}",
        )
    return t


def plan_title(spec: JobSpec) -> str:
    return (
        f"snugfit plan {spec.id or ''}: {spec.model_name} at {spec.request_rate:g} req/s, "
        f"{spec.input_len}/{spec.output_len} tokens, p95 TTFT <= {spec.slo_ttft_s} s, "
        f"TPOT <= {spec.slo_tpot_s} s ({spec.framework.value if spec.framework else ''})"
    )


def plan_parts(p: ServingPlan, max_rows: int = 15) -> list[Any]:
    """The options table for one job, its engine flags and skipped shapes (tables and lines)."""
    options = p.to_contract()["options"]
    parts: list[Any] = [contract_table(plan_title(p.spec), options, p.chosen, max_rows)]
    if len(p.options) > max_rows:
        parts.append(f"... {len(p.options) - max_rows} more options (use --json for all)")
    parts.append(("chosen: " if p.chosen is not None else "no option: ") + p.reason)
    for engine, argv in p.engine_flags().items():
        parts.append(f"  {engine}: {shlex.join(argv)}")
    if p.skipped:
        parts.append(
            f"not considered ({len(p.skipped)}): "
            + "; ".join(f"{label}: {why}" for label, why in p.skipped[:4])
            + (" ..." if len(p.skipped) > 4 else "")
        )
    return parts


def render_plan(p: ServingPlan, out: TextIO | None = None, max_rows: int = 15) -> None:
    """Print :func:`plan_parts` to ``out`` (a file, at 200 columns) or stdout by the rule of
    :mod:`scheduler.cli.output`."""
    parts = plan_parts(p, max_rows)
    if out is None:
        Output(resolve_format(None)).print(parts)
        return
    from rich.console import Console

    console = Console(file=out, width=200)
    for part in parts:
        if isinstance(part, str):
            console.print(part, markup=False, highlight=False)
        else:
            console.print(part)


@click.command("plan")
@jobs_file_option("`task: serve` jobs as YAML, JSON or JSONL.")
@click.option("--gpu", type=click.Choice(GPU_NAMES), default=None, help="Plan on one type only.")
@output_options(json_help="One contract object per job per line.")
def plan_command(input_path: Path, gpu: str | None, out: Output) -> None:
    """Choose GPU type, TP, precision, batch and replicas meeting each job's latency SLO at the
    lowest cost. Throughputs are output tokens/s of one replica (its whole TP group)."""
    try:
        specs = load_specs(input_path)
        plans = [plan(s, [gpu] if gpu else None) for s in specs]
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    for p in plans:
        if out.json:
            sys.stdout.write(dumps_json(p.to_contract()) + "\n")
        else:
            out.print(plan_parts(p))
