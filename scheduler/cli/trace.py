"""``snugfit trace --input jobs.jsonl``: warm the traced tier's cache.

The logic lives in ``predictor.traced``; this module only parses options and prints.
"""

from __future__ import annotations

from pathlib import Path

import click

from scheduler.cli.output import dumps_json

__all__ = ["trace_command"]


@click.command("trace")
@click.option("--input", "input_path", required=True, type=click.Path(path_type=Path))
@click.option("--workers", default=1, show_default=True, help="Trace worker processes (1-2).")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, help="Seconds per trace.")
@click.option("--force", is_flag=True, help="Re-trace jobs that are already cached.")
@click.option("--json", "as_json", is_flag=True, help="One JSON outcome per job.")
def trace_command(
    input_path: Path, workers: int, timeout_s: float, force: bool, as_json: bool
) -> None:
    """Trace each job's PyTorch program on the CPU and cache its peak memory."""
    from predictor.exceptions import PredictorError
    from predictor.spec import load_specs
    from predictor.traced import is_available, trace_specs

    try:
        specs = load_specs(input_path)
        if not is_available():
            raise click.ClickException(
                "the traced tier needs torch, transformers and peft: pip install 'snugfit[trace]'"
            )
        outs = trace_specs(specs, workers=workers, timeout_s=timeout_s, force=force)
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    for i, o in enumerate(outs):
        peak = o.summary["reserved_gib"] if o.summary else None
        if as_json:
            row: dict[str, object] = {"id": o.id or f"job-{i}", "status": o.status, "key": o.key}
            row.update({"reserved_gib": peak, "reason": o.reason or None, "wall_s": o.wall_s})
            click.echo(dumps_json(row))
        else:
            what = f"reserved {peak:.2f} GiB" if peak is not None else o.reason.splitlines()[0]
            click.echo(f"{o.id or f'job-{i}'}: {o.status}  {what}")
