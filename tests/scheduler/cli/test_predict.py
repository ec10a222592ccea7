"""`snugfit predict`: JSONL out, one contract row per job and GPU type; errors name the field."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from predictor.gpus import GPU_NAMES
from predictor.prediction import Prediction
from scheduler.cli import cli as main

_JOBS = [
    {"id": "a", "model": "llama-3.1-8b", "task": "inference", "batch_size": 4},
    {"id": "b", "model": "qwen2.5-7b", "task": "lora", "lora_rank": 8, "gpu": "H100-80GB"},
]


def _write(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    p = tmp_path / "jobs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_predict_writes_one_valid_row_per_job_and_gpu(tmp_path: Path) -> None:
    jobs = _write(tmp_path, _JOBS)
    res = CliRunner().invoke(main, ["predict", "--input", str(jobs), "--tier", "analytical"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    # Job a on every type; job b pinned to its GPU.
    assert [(r["id"], r["gpu"]) for r in rows] == [("a", g) for g in GPU_NAMES] + [
        ("b", "H100-80GB")
    ]
    for r in rows:
        p = Prediction.model_validate(r)  # the DESIGN.md contract
        assert p.peak_vram_upper_gib >= p.peak_vram_gib > 0


def test_predict_to_a_file_matches_stdout(tmp_path: Path) -> None:
    jobs, out = _write(tmp_path, _JOBS), tmp_path / "preds.jsonl"
    args = ["predict", "--input", str(jobs), "--tier", "analytical"]
    to_stdout = CliRunner().invoke(main, args)
    to_file = CliRunner().invoke(main, [*args, "--output", str(out)])
    assert to_file.exit_code == 0 and "wrote 6 predictions for 2 jobs" in to_file.output
    assert out.read_text() == to_stdout.stdout


def test_predict_names_the_bad_field(tmp_path: Path) -> None:
    jobs = _write(
        tmp_path,
        [{"model": "llama-3.1-8b", "task": "inference", "n_gpus": 8, "tensor_parallel": 3}],
    )
    res = CliRunner().invoke(main, ["predict", "--input", str(jobs)])
    assert res.exit_code != 0
    assert "`tensor_parallel` must divide `n_gpus`; got 3 and 8" in res.output
