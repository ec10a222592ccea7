"""`snugfit predict`, `snugfit models`, `snugfit gpus`: offline, no Redis."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO, cast

import click
import orjson

from predictor.exceptions import PredictorError
from predictor.gpus import GPU_NAMES, GpuType, gpu_catalogue
from predictor.models import catalogue
from predictor.prediction import Prediction, contract_rows
from predictor.spec import JobSpec, load_specs
from scheduler.cli._options import jobs_file_option
from scheduler.cli.output import Format, Output, output_options

__all__ = ["gpus_command", "models_command", "predict_command", "render_predictions"]


def _load_predictor(tier: str):  # type: ignore[no-untyped-def]
    """The tiered predictor when a learned artifact ships, else the analytical tier."""
    if tier == "analytical":
        from predictor import analytical

        return analytical
    from predictor.tiered import TieredPredictor
    from predictor.traced import TracedPredictor

    # `traced` waits for the traces the cache lacks; `auto` answers those analytically.
    return TieredPredictor.default(traced=TracedPredictor(wait=tier == "traced"))


def render_predictions(
    specs: list[JobSpec],
    preds: list[Prediction],
    out: TextIO | None = None,
    fmt: Format = "table",
) -> None:
    from rich.console import Console
    from rich.table import Table

    by_id = {s.id or f"#{i}": s for i, s in enumerate(specs)}
    table = Table(title="snugfit predict: per-GPU peak VRAM (GiB) and runtime", show_lines=False)
    for col in ("job", "model", "task", "GPU", "fits", "peak", "upper", "top component"):
        table.add_column(col, justify="right" if col in ("peak", "upper") else "left")
    table.add_column("runtime", justify="right")
    table.add_column("method")
    for p in preds:
        spec = by_id.get(p.id or "")
        top = max(
            ((k, v) for k, v in p.breakdown_gib.items() if k != "overhead"), key=lambda kv: kv[1]
        )
        table.add_row(
            p.id or "",
            spec.model_name if spec else "",
            spec.task.value if spec else "",
            p.gpu,
            "[green]yes[/]" if p.fits else "[red]no[/]",
            f"{p.peak_vram_gib:.1f}",
            f"{p.peak_vram_upper_gib:.1f}",
            f"{top[0]} {top[1]:.1f}",
            _human_seconds(p.runtime_s),
            p.method,
        )
    if out is not None:
        Console(file=out, width=160).print(table)
        return
    Output(fmt).print(table)


def _human_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


@click.command("predict")
@jobs_file_option()
@click.option("--gpu", type=click.Choice(GPU_NAMES), default=None, help="Predict for one type.")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="JSONL output file.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "json", "table", "tsv"]),
    default="jsonl",
    show_default=True,
    help="jsonl / json: one Prediction per line (the contract); table; tsv (tab-separated).",
)
@click.option(
    "--tier",
    type=click.Choice(["auto", "analytical", "traced"]),
    default="auto",
    show_default=True,
    help="auto = learned + history + cached traces, else analytical; traced = wait for traces.",
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format jsonl.")
def predict_command(
    input_path: Path, gpu: str | None, output: Path | None, fmt: str, tier: str, as_json: bool
) -> None:
    """One Prediction per line and GPU type: the job's pinned `gpu`, else --gpu, else all."""
    if as_json:
        fmt = "jsonl"
    try:
        specs = load_specs(input_path)
        # Give id-less jobs a stable id so each output line can be matched to its input.
        specs = [
            s if s.id else s.model_copy(update={"id": f"job-{i}"}) for i, s in enumerate(specs)
        ]
        rows = list(
            contract_rows(_load_predictor(tier).predict_table, specs, [gpu] if gpu else None)
        )
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    if fmt in ("table", "tsv") and output is None:
        render_predictions(
            specs, [Prediction.model_construct(**r) for r in rows], fmt=cast(Format, fmt)
        )
        return
    # JSONL needs only the rows: a Prediction object per row was a fifth of the command's time,
    # and the standard library's encoder half of what was left (orjson also writes inf as null).
    lines = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    if output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(lines)
        sys.stdout.buffer.flush()
    else:
        output.write_bytes(lines)
        click.echo(f"wrote {len(rows)} predictions for {len(specs)} jobs to {output}", err=True)
        if fmt in ("table", "tsv"):
            render_predictions(
                specs, [Prediction.model_construct(**r) for r in rows], fmt=cast(Format, fmt)
            )


@click.command("models")
@output_options(json_help="Machine-readable output: catalogue name -> architecture.")
def models_command(out: Output) -> None:
    """List catalogue models with their parameter counts and sources."""
    cat = catalogue()
    if out.json:
        out.emit_json({k: v.to_dict() for k, v in cat.items()}, indent=1)
        return
    from rich.table import Table

    t = Table(title="Model catalogue")
    for c in ("name", "params (B)", "active (B)", "layers", "hidden", "heads/kv", "vocab"):
        t.add_column(c)
    for name, m in cat.items():
        t.add_row(
            name,
            f"{m.total_params() / 1e9:.2f}",
            f"{m.active_params() / 1e9:.2f}",
            str(m.n_layers),
            str(m.hidden_size),
            f"{m.n_heads}/{m.n_kv_heads}",
            str(m.vocab_size),
        )
    out.print(t)


@click.command("gpus")
@click.option(
    "--efficiencies",
    is_flag=True,
    help="Print the runtime model's efficiency table (fitted and quoted) instead.",
)
@output_options(
    json_help="One object per GPU type: memory, bandwidth, dense peaks, MIG profiles, price."
)
def gpus_command(efficiencies: bool, out: Output) -> None:
    """List GPU types: memory, bandwidth, peaks, MIG profiles and prices."""
    from rich.table import Table

    if efficiencies:
        from predictor.efficiency import efficiency_table_text

        click.echo(efficiency_table_text())
        return
    if out.json:
        out.emit_json([_gpu_json(g) for g in gpu_catalogue().values()])
        return
    t = Table(title="GPU catalogue (dense peaks)")
    for c in ("GPU", "memory GiB", "HBM GB/s", "BF16 TFLOPS", "FP8", "FP4", "$/h", "MIG profiles"):
        t.add_column(c)
    for g in gpu_catalogue().values():
        t.add_row(
            g.name,
            f"{g.memory_gib:g}",
            f"{g.hbm_bandwidth_gbps:g}",
            f"{g.peak_tflops['bf16']:g}",
            f"{g.peak_tflops.get('fp8', 0):g}" if "fp8" in g.peak_tflops else "-",
            f"{g.peak_tflops.get('fp4', 0):g}" if "fp4" in g.peak_tflops else "-",
            f"{g.price_usd_per_hour:.2f}",
            " ".join(p.name for p in g.mig_profiles),
        )
    out.print(t)


def _gpu_json(g: GpuType) -> dict[str, object]:
    """One GPU type as typed JSON (peaks in dense TFLOP/s by dtype; sources as quoted)."""
    return {
        "name": g.name,
        "memory_gib": g.memory_gib,
        "hbm_bandwidth_gbps": g.hbm_bandwidth_gbps,
        "peak_tflops": dict(g.peak_tflops),
        "nvlink_bandwidth_gbps": g.nvlink_bandwidth_gbps,
        "tdp_w": g.tdp_w,
        "price_usd_per_hour": g.price_usd_per_hour,
        "mig_profiles": [
            {
                "name": p.name,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "memory_gib": p.memory_gib,
                "max_instances": p.max_instances,
                "placements": list(p.placements),
            }
            for p in g.mig_profiles
        ],
        "sources": dict(g.sources),
    }
