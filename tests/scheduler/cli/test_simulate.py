from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from scheduler.cli.simulate import simulate_command
from tests.openb_csv import NODE_HEAD, POD_HEAD

NODES = NODE_HEAD + "n0,64000,262144,8,G2\nn1,32000,131072,2,T4\n"
PODS = (
    POD_HEAD + "p0,4000,4096,1,500,,LS,Running,0,1,0\n"
    "p1,4000,4096,1,1000,,LS,Running,0,1,0\n"
    "p2,2000,4096,0,0,,LS,Running,0,1,0\n"
)


def _simulate_json(*args: str) -> dict[str, Any]:
    """``snugfit simulate ARGS --json``: exits 0 and prints one JSON object."""
    res = CliRunner().invoke(simulate_command, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output)
    return out


def test_openb_json(tmp_path: Path) -> None:
    (tmp_path / "n.csv").write_text(NODES)
    (tmp_path / "p.csv").write_text(PODS)
    nodes, pods = str(tmp_path / "n.csv"), str(tmp_path / "p.csv")
    out = _simulate_json(
        "openb", "--nodes", nodes, "--pods", pods, "--policy", "bestfit", "--policy", "fgdstrand",
        "--seeds", "2",
    )  # fmt: skip
    assert [r["policy"] for r in out["policies"]] == ["bestfit", "fgdstrand"]
    for r in out["policies"]:
        assert set(r["allocation_ratio_by_demand"]) == {str(i) for i in range(131)}
        assert 0 <= r["unallocated_gpu_pct_at_130"] <= 100


def test_openb_missing_file_is_a_clean_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(simulate_command, ["openb", "--nodes", str(tmp_path / "x.csv")])
    assert res.exit_code != 0
    assert "does not exist" in res.output


def test_workload_json_runs_to_the_end() -> None:
    out = _simulate_json(
        "workload", "--policy", "rightsize", "--policy", "requested", "--days", "0.2",
        "--jobs-per-day", "200",
    )  # fmt: skip
    assert out["feedback"] is True and out["predictor"] == "analytical"
    assert [r["policy"] for r in out["results"]] == ["rightsize", "requested"]
    for r in out["results"]:
        assert r["n_finished"] + r["n_rejected"] == out["n_jobs"]


def test_workload_table_and_no_feedback() -> None:
    res = CliRunner().invoke(
        simulate_command,
        ["workload", "--policy", "fgd", "--days", "0.1", "--jobs-per-day", "200", "--no-feedback"],
    )
    assert res.exit_code == 0, res.output
    assert "fgd" in res.output
