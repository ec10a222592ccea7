"""The shipped sweeps: valid JobSpecs, cheapest first, sized for ~8 minutes, covering the axes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from predictor.spec import DType, JobSpec, Task, load_specs
from workers.profile._model import hf_config_kwargs
from workers.profile.sweep import CALIBRATION_S, estimate_job_s, h200_jobs, write_sweep

SWEEPS = Path(__file__).resolve().parents[3] / "datasets" / "sweeps"
H200 = SWEEPS / "h200.yaml"


@pytest.fixture(scope="module")
def specs() -> list[JobSpec]:
    return load_specs(H200)  # raises on the first invalid entry, naming it


def test_every_entry_is_a_valid_jobspec_with_a_unique_id(specs: list[JobSpec]) -> None:
    assert 120 <= len(specs) <= 180
    ids = [s.id for s in specs]
    assert all(ids) and len(set(ids)) == len(ids)


def test_the_committed_file_is_what_the_generator_writes(tmp_path: Path) -> None:
    fresh = tmp_path / "h200.yaml"
    write_sweep(fresh, h200_jobs())
    assert fresh.read_text() == H200.read_text(), (
        "datasets/sweeps/h200.yaml is stale; regenerate it: .venv/bin/python -m "
        "workers.profile.sweep"
    )


def test_cheapest_first_and_sized_for_about_eight_minutes(specs: list[JobSpec]) -> None:
    est = [estimate_job_s(s) for s in specs]
    assert est == sorted(est)
    total_min = (sum(est) + CALIBRATION_S) / 60
    assert 6.0 <= total_min <= 9.0
    header = H200.read_text().split("\n- ", 1)[0]
    stated = float(re.search(r"= ([\d.]+) min", header).group(1))  # type: ignore[union-attr]
    assert stated == pytest.approx(total_min, abs=0.05)


def test_every_model_maps_to_a_hugging_face_class(specs: list[JobSpec]) -> None:
    for s in specs:
        hf_config_kwargs(s.arch)  # UnsupportedJob would mean a job that can never run


def test_the_sweep_covers_the_predictor_axes(specs: list[JobSpec]) -> None:
    params_b = [s.arch.total_params() / 1e9 for s in specs]
    assert min(params_b) < 0.15 and 12 < max(params_b) < 16
    assert any(s.arch.is_moe for s in specs if s.task is Task.INFERENCE)
    assert any(s.arch.is_moe for s in specs if s.task.is_training)
    inf = [s for s in specs if s.task is Task.INFERENCE]
    assert {1, 64} <= {s.batch_size for s in inf}
    assert {128, 4096} <= {s.input_len for s in inf}
    assert {32, 512} <= {s.output_len for s in inf}
    ft = [s for s in specs if s.task is Task.FULL_FINETUNE]
    assert {True, False} == {s.gradient_checkpointing for s in ft}
    assert any(s.optimizer is not None and s.optimizer.value == "adamw" for s in ft)
    lora = [s for s in specs if s.task is Task.LORA]
    assert {8, 64} <= {s.lora_rank for s in lora}
    assert {512, 4096} <= {s.seq_len for s in lora}
    assert {1, 16} <= {s.batch_size for s in lora}
    assert {True, False} == {s.gradient_checkpointing for s in lora}
    assert {"all_linear", "qv", "attention"} == {s.lora_target.value for s in lora if s.lora_target}
    assert any(s.task is Task.QLORA for s in specs)
    dtypes = {s.weight_dtype for s in specs}
    assert {DType.BF16, DType.FP32, DType.INT8} <= dtypes
    assert any(s.optimizer is not None and "8bit" in s.optimizer.value for s in specs)
    assert sum(s.weight_dtype is DType.BF16 for s in specs) > 0.8 * len(specs)


def test_cpu_smoke_sweep_is_tiny_and_valid() -> None:
    smoke = load_specs(SWEEPS / "cpu-smoke.yaml")
    assert 3 <= len(smoke) <= 10
    assert all(s.arch.total_params() < 1_000_000 for s in smoke)
    assert {Task.INFERENCE, Task.FULL_FINETUNE, Task.LORA} <= {s.task for s in smoke}
