"""``snugfit gpus``: the catalogue table and ``--efficiencies``."""

from __future__ import annotations

from click.testing import CliRunner

from predictor.efficiency import PARAMETERS
from scheduler.cli.predict import gpus_command


def test_gpus_lists_the_catalogue() -> None:
    res = CliRunner().invoke(gpus_command, [])
    assert res.exit_code == 0, res.output
    assert "H200-141GB" in res.output


def test_gpus_efficiencies_prints_every_parameter_fitted_or_quoted() -> None:
    res = CliRunner().invoke(gpus_command, ["--efficiencies"])
    assert res.exit_code == 0, res.output
    for p in PARAMETERS:
        assert p.name in res.output
    assert "fitted" in res.output and "quoted" in res.output
