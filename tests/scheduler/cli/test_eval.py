import json
from pathlib import Path

from click.testing import CliRunner

from scheduler.cli.eval import eval_command

PUBLISHED = Path(__file__).resolve().parents[3] / "datasets" / "measured" / "published.jsonl"
# A few sources with time rows on several GPU types (cross-GPU pairs) and peak-VRAM rows: the
# analytical tier refits its efficiencies once per held-out source, so the whole data set would
# cost minutes here; `benchmarks/bench_eval.py` scores all of it.
_SOURCES = ("trtllm_perf_v0.6.1", "trtllm_blog_h100vsa100", "HF transformers docs", "PEFT ")


def test_eval_analytical_json(tmp_path):
    rows = [
        line
        for line in PUBLISHED.read_text().splitlines()
        if any(f'"source": "{s}' in line for s in _SOURCES)
    ]
    assert len(rows) > 20
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "eval.json"
    args = ["--tier", "analytical", "--json", "--output", str(out), "--data", str(data)]
    res = CliRunner().invoke(eval_command, args)
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
