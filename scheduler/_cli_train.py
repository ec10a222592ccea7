"""``snugfit train``: fit the learned tier on measured data and write a versioned artifact."""

from __future__ import annotations

import json
from pathlib import Path

import click

__all__ = ["train_command"]


@click.command(name="train")
@click.option(
    "--data",
    "paths",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Measurement JSONL file(s); default: datasets/measured/*.jsonl.",
)
@click.option(
    "--history",
    "history",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Worker history JSONL file(s) to train on as well (simulated rows are ignored).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Artifact path; default: the shipped datasets/artifacts/learned.json.",
)
@click.option("--coverage", default=0.95, show_default=True, help="Upper-bound target coverage.")
@click.option("--folds", default=5, show_default=True, help="Grouped CV folds (by source).")
def train_command(
    paths: tuple[str, ...],
    history: tuple[str, ...],
    output: str | None,
    coverage: float,
    folds: int,
) -> None:
    """Train the learned tier; a metric that grouped CV finds worse falls back to analytical."""
    from predictor.artifact import save_artifact
    from predictor.exceptions import PredictorError
    from predictor.learned import LearnedPredictor
    from predictor.measurements import default_measurement_paths, load_measurements

    try:
        files = [Path(p) for p in paths] or default_measurement_paths()
        ms = load_measurements([*files, *(Path(h) for h in history)])
        model = LearnedPredictor(coverage=coverage, n_splits=folds).fit(ms)
        out = save_artifact(model, output)
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"trained {model.method} on {len(ms)} measured runs → {out}")
    for metric, cv in model.cv_.items():
        state = "fallback: " + model.fallback_[metric] if metric in model.fallback_ else "enabled"
        click.echo(
            f"  {metric:14s} grouped-CV MAPE analytical {cv['analytical_mape']:.1%} "
            f"learned {cv['learned_mape']:.1%}  [{state}]"
        )
    for metric, why in model.fallback_.items():
        if metric not in model.cv_:
            click.echo(f"  {metric:14s} [fallback: {why}]")
    click.echo(json.dumps({"version": model.version_, "data_hash": model.data_hash_}))
