"""Click options that several commands share, declared once."""

from __future__ import annotations

import click

__all__ = ["measurement_files"]

#: ``--data``: the measured rows a predictor command reads (``datasets/measured`` by default).
measurement_files = click.option(
    "--data",
    "paths",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Measurement JSONL file(s); default: datasets/measured/*.jsonl.",
)
