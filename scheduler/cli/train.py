"""``snugfit train``: fit the learned tier on measured data and write a versioned artifact.

The artifact goes to ``$SNUGFIT_HOME/artifacts/learned.json`` (the one it replaces is kept as
``learned.previous.json``); the shipped ``datasets/artifacts/learned.json`` changes only with
``--overwrite-shipped``.

Training data: ``datasets/measured/*.jsonl`` (or ``--data``), plus the cluster's own history
from JSONL files (``--history``) and/or the Redis list the workers append to (``--redis`` or
``SNUGFIT_REDIS_URL``; key ``scheduler.service.store.keys.Keys(prefix).history``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from scheduler.cli._options import measurement_files
from scheduler.cli.output import Output, output_options

if TYPE_CHECKING:
    from predictor.measurements import Measurement

__all__ = ["read_redis_history", "train_command"]


def read_redis_history(url: str, prefix: str | None = None) -> list[Measurement]:
    """Every measurement row in the service's history list (simulated rows are dropped).

    A malformed row is skipped with a warning rather than failing the whole training run: the
    list is written by many workers, and one bad writer must not block retraining.
    """
    import redis

    from predictor.measurements import measurements_from_lines
    from scheduler.service.store.keys import DEFAULT_PREFIX, Keys

    key = Keys(prefix or DEFAULT_PREFIX).history
    client = redis.Redis.from_url(url)
    try:
        raw = client.lrange(key, 0, -1)
    except redis.RedisError as exc:
        raise click.ClickException(
            f"cannot read history list {key!r} from {url!r} ({exc}); check --redis / "
            "SNUGFIT_REDIS_URL, or train without it"
        ) from None
    finally:
        client.close()
    return measurements_from_lines(raw, f"{url} {key}", strict=False)


def _output_path(output: str | None, overwrite_shipped: bool) -> Path:
    """Where the artifact goes. Training never replaces the shipped artifact by accident: it
    writes under $SNUGFIT_HOME and keeps the artifact it replaces there."""
    from predictor.artifact import default_artifact_path
    from scheduler.service.store.embedded import snugfit_home

    if overwrite_shipped:
        return default_artifact_path()
    if output is not None:
        return Path(output)
    out = snugfit_home() / "artifacts" / "learned.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.replace(out.with_name("learned.previous.json"))
    return out


@click.command(name="train")
@measurement_files
@click.option(
    "--history",
    "history",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Worker history JSONL file(s) to train on as well (simulated rows are ignored).",
)
@click.option(
    "--redis",
    "redis_url",
    default=None,
    envvar="SNUGFIT_REDIS_URL",
    help="Also train on the service's history list in this Redis (default: SNUGFIT_REDIS_URL).",
)
@click.option("--prefix", default=None, help="Redis key prefix of the service (default snugfit).")
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Artifact path (default: $SNUGFIT_HOME/artifacts/learned.json; the artifact there "
    "before is kept as learned.previous.json).",
)
@click.option(
    "--overwrite-shipped",
    is_flag=True,
    help="Write the shipped datasets/artifacts/learned.json instead (a release step).",
)
@click.option(
    "--coverage", default=0.95, show_default=True, help="Peak-VRAM upper-bound target coverage."
)
@click.option(
    "--runtime-coverage",
    default=0.90,
    show_default=True,
    help="Runtime upper-bound target coverage.",
)
@click.option("--folds", default=5, show_default=True, help="Grouped CV folds (by source).")
@output_options(
    table=False,
    json_help="One JSON object: version, data hash, artifact path and per-metric CV and state.",
)
def train_command(
    paths: tuple[str, ...],
    history: tuple[str, ...],
    redis_url: str | None,
    prefix: str | None,
    output: str | None,
    overwrite_shipped: bool,
    coverage: float,
    runtime_coverage: float,
    folds: int,
    out: Output,
) -> None:
    """Train the learned tier; a metric that grouped CV finds worse falls back to analytical."""
    from predictor.artifact import save_artifact
    from predictor.exceptions import PredictorError
    from predictor.learned import LearnedPredictor
    from predictor.measurements import default_measurement_paths, load_measurements

    if overwrite_shipped and output is not None:
        raise click.UsageError("--output and --overwrite-shipped exclude each other")
    try:
        files = [Path(p) for p in paths] or default_measurement_paths()
        ms = load_measurements([*files, *(Path(h) for h in history)])
        n_redis = 0
        if redis_url:
            seen = {m.id for m in ms}
            extra = [m for m in read_redis_history(redis_url, prefix) if m.id not in seen]
            n_redis = len(extra)
            ms = [*ms, *extra]
        from predictor.traced import is_available
        from predictor.traced.evaluation import warm_measured

        # Residuals on the best base: traced peaks (traced now if missing) where available.
        base = warm_measured(ms, workers=2) if is_available() else None
        model = LearnedPredictor(
            coverage=coverage, n_splits=folds, runtime_coverage=runtime_coverage, base=base
        ).fit(ms)
        out_path = save_artifact(model, _output_path(output, overwrite_shipped))
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    if out.json:
        metrics: dict[str, dict[str, object]] = {}
        for metric in sorted(set(model.cv_) | set(model.fallback_)):
            cv = model.cv_.get(metric, {})
            metrics[metric] = {
                "analytical_mape": cv.get("analytical_mape"),
                "learned_mape": cv.get("learned_mape"),
                "enabled": metric not in model.fallback_,
                "shrink": model.shrink_.get(metric),
                "fallback_reason": model.fallback_.get(metric),
            }
        out.emit_json(
            {
                "method": model.method,
                "version": model.version_,
                "data_hash": model.data_hash_,
                "n_runs": len(ms),
                "n_from_redis": n_redis if redis_url else None,
                "artifact": str(out_path),
                "metrics": metrics,
            }
        )
        return
    where = f" ({n_redis} from Redis history)" if redis_url else ""
    click.echo(f"trained {model.method} on {len(ms)} measured runs{where} → {out_path}")
    for metric, cv in model.cv_.items():
        state = (
            "fallback: " + model.fallback_[metric]
            if metric in model.fallback_
            else f"enabled, shrink {model.shrink_[metric]:.1f}"
        )
        click.echo(
            f"  {metric:14s} nested grouped-CV MAPE analytical {cv['analytical_mape']:.1%} "
            f"learned {cv['learned_mape']:.1%}  [{state}]"
        )
    for metric, why in model.fallback_.items():
        if metric not in model.cv_:
            click.echo(f"  {metric:14s} [fallback: {why}]")
    click.echo(json.dumps({"version": model.version_, "data_hash": model.data_hash_}))
