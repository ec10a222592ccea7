import json

from click.testing import CliRunner

from scheduler.cli.eval import eval_command


def test_eval_analytical_json(tmp_path):
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(eval_command, ["--tier", "analytical", "--json", "--output", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    rep = doc["reports"][0]
    assert rep["tier"] == "analytical"
    assert rep["overall"]["peak_vram_gib"]["n"] > 0
    assert "by_source" in rep and "cross_gpu_ratio" in rep


def test_eval_table_renders():
    res = CliRunner().invoke(eval_command, ["--tier", "history"])
    assert res.exit_code == 0, res.output
    assert "history" in res.output
