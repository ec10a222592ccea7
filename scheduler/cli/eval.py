"""``snugfit eval``: accuracy of each predictor tier on measured data, side by side.

The analytical tier's efficiency table is refitted leave-one-source-out, so its time figures
are out of source (its memory model is not fitted and is scored directly). The learned and
history tiers are scored with grouped cross-validation (GroupKFold by source), so each figure
says how the tier does on a setup it never saw. The computation lives in
``predictor.evaluation`` / ``predictor.learned``; this module only renders.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from scheduler.cli._options import measurement_files
from scheduler.cli.output import Output, dumps_json, output_options

__all__ = ["eval_command"]

_METRIC_LABEL = {
    "peak_vram_gib": "peak VRAM",
    "step_time_s": "step time",
    "ttft_s": "TTFT",
    "tpot_s": "TPOT",
    "runtime_s": "runtime",
}


def _pct(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _reports(tier: str, paths: tuple[str, ...], folds: int) -> list[Any]:
    from predictor.measurements import load_measurements

    ms = load_measurements(list(paths) or None)
    out = []
    tiers = ["analytical", "traced", "learned", "history"] if tier == "all" else [tier]
    oos = None
    if "analytical" in tiers or "learned" in tiers:
        from predictor._fit import OutOfSourceAnalytical

        # Efficiencies refitted once per held-out source, shared by both tiers.
        oos = OutOfSourceAnalytical.from_measurements(ms)
    for t in tiers:
        if t == "analytical":
            from predictor._fit import evaluate_out_of_source

            out.append(evaluate_out_of_source(ms, oos))
        elif t == "traced":
            from predictor.traced.evaluation import traced_reports

            out.extend(traced_reports(ms, workers=2))
        elif t == "learned":
            from predictor.learned import cross_validate
            from predictor.traced.evaluation import warm_measured

            # Corrections of the best base: traced peaks where a trace exists, else the
            # analytical tier with its out-of-source time figures.
            base = warm_measured(ms, workers=2, analytical=oos)
            out.append(cross_validate(ms, n_splits=folds, base=base).report)
        else:
            from predictor.history import cross_validate_history

            out.append(cross_validate_history(ms, n_splits=folds))
    return out


def _render(reports: list[Any]) -> list[Any]:
    from rich.table import Table

    parts: list[Any] = []
    table = Table(title="Accuracy on measured data (learned/history: grouped CV by source)")
    for col in ("tier", "metric", "n", "MAPE", "median", "≤10%", "coverage", "headroom", "bias"):
        table.add_column(col, justify="right" if col not in ("tier", "metric") else "left")
    for rep in reports:
        for metric, s in rep.overall.items():
            table.add_row(
                rep.tier,
                _METRIC_LABEL.get(metric, metric),
                str(s.n),
                _pct(s.mape),
                _pct(s.median_ape),
                _pct(s.within_10pct),
                _pct(s.coverage),
                _pct(s.mean_headroom),
                _pct(s.bias),
            )
        if rep.ratio_summary:
            r = rep.ratio_summary
            table.add_row(
                rep.tier,
                "cross-GPU ratio",
                str(int(r["n_pairs"])),
                _pct(r["mean_error"]),
                _pct(r["median_error"]),
                _pct(r["within_10pct"]),
                "",
                "",
                "",
            )
    parts.append(table)
    for rep in reports:
        for title, groups in (
            ("task", rep.by_task),
            ("GPU", rep.by_gpu),
            ("source", rep.by_source),
        ):
            t = Table(title=f"{rep.tier}: MAPE by {title}")
            t.add_column("metric")
            t.add_column(title)
            for col in ("n", "MAPE", "median", "coverage"):
                t.add_column(col, justify="right")
            for metric, d in groups.items():
                for key, s in d.items():
                    t.add_row(
                        _METRIC_LABEL.get(metric, metric),
                        key[:60],
                        str(s.n),
                        _pct(s.mape),
                        _pct(s.median_ape),
                        _pct(s.coverage),
                    )
            parts.append(t)
    skipped = reports[0].unexpressed if reports else []
    if skipped:
        lines = [f"{len(skipped)} measured values not expressible:"]
        lines += [f"  {u.id} {u.metric}: {u.reason}" for u in skipped[:50]]
        parts.append("\n".join(lines))
    return parts


@click.command(name="eval")
@click.option(
    "--tier",
    type=click.Choice(["analytical", "traced", "learned", "history", "all"]),
    default="analytical",
    show_default=True,
    help="Which predictor tier to score.",
)
@measurement_files
@click.option("--folds", default=5, show_default=True, help="Grouped CV folds (learned/history).")
@output_options(json_help="Print the report as JSON.")
@click.option("--output", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
def eval_command(
    tier: str, paths: tuple[str, ...], folds: int, out: Output, output: str | None
) -> None:
    """Score predictor tiers against measured runs (never against predicted numbers)."""
    from predictor.exceptions import PredictorError

    try:
        reports = _reports(tier, paths, folds)
    except PredictorError as exc:
        raise click.ClickException(str(exc)) from None
    payload = {"reports": [r.to_dict() for r in reports]}
    text = dumps_json(payload, indent=2)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text + "\n")
    if out.json:
        click.echo(text)
        return
    out.print(_render(reports))
