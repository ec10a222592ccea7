"""`snugfit plan`: the --json contract lines, the table, and one clear error for bad input."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from predictor.gpus import GPU_NAMES
from scheduler.cli.plan import plan_command


def test_cli_json_one_line_per_job_and_table(tmp_path: Path) -> None:
    f = tmp_path / "serve.yaml"
    f.write_text(
        "- {id: a, model: llama-3.1-8b, task: serve, request_rate: 2}\n"
        "- {id: b, model: llama-3.1-8b, task: serve, request_rate: 50, slo_ttft_s: null}\n"
    )
    res = CliRunner().invoke(plan_command, ["--input", str(f), "--json", "--gpu", "H100-80GB"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.output.splitlines()]
    assert [x["id"] for x in lines] == ["a", "b"]
    assert all(o["gpu"] == "H100-80GB" for x in lines for o in x["options"])
    assert any(o["mig_profile"] for x in lines for o in x["options"])
    table = CliRunner().invoke(plan_command, ["--input", str(f)])
    assert table.exit_code == 0 and "CHOSEN" in table.output and "vllm serve" in table.output


def test_cli_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("{model: llama-3.1-8b, task: serve, request_rate: 0}\n")
    res = CliRunner().invoke(plan_command, ["--input", str(f)])
    assert res.exit_code != 0 and "`request_rate` must be > 0" in res.output
    f.write_text("{model: llama-3.1-8b, task: inference}\n")
    res = CliRunner().invoke(plan_command, ["--input", str(f)])
    assert res.exit_code != 0 and "plans `serve` jobs" in res.output


def test_cli_json_gpu_is_a_catalogue_type_for_every_option(tmp_path: Path) -> None:
    f = tmp_path / "serve.yaml"
    f.write_text("{id: a, model: llama-3.1-8b, task: serve, request_rate: 2}\n")
    res = CliRunner().invoke(plan_command, ["--input", str(f), "--json"])
    assert res.exit_code == 0, res.output
    options = json.loads(res.output)["options"]
    assert {o["gpu"] for o in options} <= set(GPU_NAMES)
    mig = [o for o in options if o["mig_profile"]]
    assert mig and all("MIG" not in o["gpu"] and "." in o["mig_profile"] for o in mig)
