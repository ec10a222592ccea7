"""The profiling harness end to end on the CPU: real tiny models, real child processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from predictor.measurements import load_measurements  # noqa: E402
from predictor.spec import load_specs, parse_spec  # noqa: E402
from workers.profile import _job as _profile_job  # noqa: E402
from workers.profile._supported import check_supported  # noqa: E402
from workers.profile.run import (  # noqa: E402
    done_ids,
    gpu_catalogue_name,
    outcome_row,
    run_calibration,
    run_profile,
    skipped_path,
)

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "datasets" / "sweeps" / "cpu-smoke.yaml"
TINY = {
    "name": "tiny-llama",
    "n_layers": 2,
    "hidden_size": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "family": "llama",
}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("profile") / "rows.jsonl"
    summary = run_profile(SMOKE, out, device="cpu", timeout_s_per_job=300)
    return out, summary


# Runners for fault injection: top level so the child process can import them by name.
def _runner_oom(spec: dict[str, Any], device: str) -> dict[str, Any]:
    return {
        "status": "oom",
        "message": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "device": "cpu",
        "notes": [],
    }


def _runner_raises(spec: dict[str, Any], device: str) -> dict[str, Any]:
    raise RuntimeError("boom: injected by the test")


def _runner_hangs(spec: dict[str, Any], device: str) -> dict[str, Any]:
    if spec["id"].endswith("hang"):
        time.sleep(600)
    return _profile_job.run_job(spec, device)


def _runner_dies(spec: dict[str, Any], device: str) -> dict[str, Any]:
    os._exit(3)


def _job(jid: str, **kw: Any) -> dict[str, Any]:
    base = {
        "id": jid,
        "model": TINY,
        "task": "inference",
        "weight_dtype": "fp32",
        "batch_size": 1,
        "input_len": 8,
        "output_len": 2,
    }
    return {**base, **kw}


def test_smoke_sweep_writes_one_honest_row_per_runnable_job(smoke_run: tuple[Path, Any]) -> None:
    out, summary = smoke_run
    specs = load_specs(SMOKE)
    rows = load_measurements(out)  # the project's own loader validates every row
    side = _lines(skipped_path(out))
    assert {r.spec.id for r in rows} | {s["job_id"] for s in side} == {s.id for s in specs}
    assert not summary.failed
    for r in rows:
        assert r.origin == "profile" and not r.simulated and not r.oom
        # CPU: nothing about VRAM or a GPU may be claimed.
        assert r.gpu is None and r.gpu_model is None and r.peak_vram_gib is None
        assert r.measurement == "unknown" and r.confidence == "low"
        assert "CPU" in r.notes
        assert r.software["torch"] == torch.__version__
        assert r.software["transformers"] and r.date
        assert r.hardware["device"] == "cpu"
        assert r.hardware["params_built"] > 0
        if r.spec.task.is_training:
            assert r.step_time_s is not None and r.step_time_s > 0
            assert r.ttft_s is None and r.tpot_s is None
            assert len(r.hardware["step_times_s"]) == r.hardware["steps_run"]
        else:
            assert r.ttft_s is not None and r.tpot_s is not None and r.step_time_s is None
            assert r.hardware["tokens_generated"] == r.spec.output_len
        if not r.spec.arch.is_moe:
            # The built model is the catalogue's architecture, parameter for parameter.
            assert r.hardware["params_built"] == r.hardware["params_arch"]


def test_peft_jobs_train_only_adapters(smoke_run: tuple[Path, Any]) -> None:
    out, _ = smoke_run
    lora = [r for r in load_measurements(out) if r.spec.task.value == "lora"]
    assert lora
    for r in lora:
        assert 0 < r.hardware["params_trainable"] < r.hardware["params_built"]
        assert r.hardware["lora_params_arch"] > 0
        # MoE all_linear reaches the (fused) expert weights too, not only attention.
        if r.spec.arch.is_moe:
            assert any("expert" in m for m in r.hardware["lora_target_modules"])


def test_jobs_needing_bitsandbytes_are_skipped_with_a_reason(smoke_run: tuple[Path, Any]) -> None:
    out, summary = smoke_run
    side = {s["job_id"]: s for s in _lines(skipped_path(out))}
    assert "smoke-llama-qlora" in side  # CPU: bitsandbytes 4-bit needs CUDA even if installed
    entry = side["smoke-llama-qlora"]
    assert entry["status"] == "skipped" and "bitsandbytes" in entry["reason"]
    assert parse_spec(entry["spec"]).id == "smoke-llama-qlora"
    assert summary.skipped == ["smoke-llama-qlora"]


def test_resume_skips_done_ids_and_reruns_a_lost_one(
    smoke_run: tuple[Path, Any], tmp_path: Path
) -> None:
    src, _ = smoke_run
    out = tmp_path / "rows.jsonl"
    lines = src.read_text().splitlines()
    # As if the sweep was killed while writing the last row: drop it, cut one in half.
    out.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:40])
    skipped_path(out).write_text(skipped_path(src).read_text())
    before = done_ids(out)
    summary = run_profile(SMOKE, out, device="cpu", timeout_s_per_job=300)
    lost = {json.loads(x)["spec"]["id"] for x in lines[-2:]}
    assert set(summary.measured) == lost
    assert set(summary.already_done) == before
    again = run_profile(SMOKE, out, device="cpu")
    assert not again.measured and not again.failed and not again.skipped
    # The torn fragment is gone: the file loads strictly, with no duplicate ids.
    assert len(load_measurements(out)) == len(lines)


def test_no_resume_starts_afresh(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    jobs = [_job("a")]
    run_profile(jobs, out, device="cpu")
    run_profile(jobs, out, device="cpu", resume=False)
    assert len(_lines(out)) == 1


def test_an_oom_becomes_a_row_not_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    summary = run_profile([_job("big")], out, device="cpu", runner=_runner_oom)
    assert summary.oom == ["big"]
    (row,) = load_measurements(out)
    assert row.oom and "lower bound" in row.notes and "out of memory" in row.notes


def test_a_real_oom_inside_the_job_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: Any, **kwargs: Any) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(_profile_job, "_infer", explode)
    outcome = _profile_job.run_job(_job("x"), "cpu")
    assert outcome["status"] == "oom"
    row = outcome_row(parse_spec(_job("x")), outcome, date="2026-01-01")
    assert row is not None and row["oom"] is True


def test_an_exception_or_a_dead_child_is_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    summary = run_profile([_job("a"), _job("b")], out, device="cpu", runner=_runner_raises)
    assert summary.failed == ["a", "b"]
    side = _lines(skipped_path(out))
    assert [s["status"] for s in side] == ["error", "error"]
    assert "boom" in side[0]["reason"]
    assert not out.exists()  # nothing measured, nothing claimed

    out2 = tmp_path / "dies.jsonl"
    run_profile([_job("c")], out2, device="cpu", runner=_runner_dies)
    (entry,) = _lines(skipped_path(out2))
    assert entry["status"] == "crashed" and "code 3" in entry["reason"]


def test_a_hung_job_times_out_and_the_next_one_runs(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    summary = run_profile(
        [_job("hang"), _job("fine")],
        out,
        device="cpu",
        timeout_s_per_job=3,
        runner=_runner_hangs,
    )
    assert summary.failed == ["hang"]
    assert summary.measured == ["fine"]
    (entry,) = _lines(skipped_path(out))
    assert entry["status"] == "timeout" and "3 s" in entry["reason"]
    # Resume does not retry a timeout unless asked to.
    assert "hang" in done_ids(out)
    assert "hang" not in done_ids(out, retry_failed=True)


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unique"):
        run_profile([_job("a"), _job("a")], tmp_path / "r.jsonl", device="cpu")


@pytest.mark.parametrize(
    ("name", "mem", "want"),
    [
        ("NVIDIA H200", 139.8, "H200-141GB"),
        ("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
        ("NVIDIA B200", 178.4, "B200-180GB"),
        ("NVIDIA L4", 22.0, None),
        (None, None, None),
    ],
)
def test_gpu_names_map_to_the_catalogue_only_when_they_are_in_it(
    name: str | None, mem: float | None, want: str | None
) -> None:
    assert gpu_catalogue_name(name, mem) == want


def test_calibration_writes_bandwidth_and_tflops(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    result = run_calibration(path, device="cpu", duration_s=1)
    assert result["status"] == "ok"
    saved = json.loads(path.read_text())
    assert saved["hbm_copy_bandwidth_gbps"] > 0 and saved["bf16_matmul_tflops"] > 0
    assert saved["software"]["torch"] == torch.__version__


def test_cli_profile_runs_a_job(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from scheduler.cli import cli

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(_job("cli-1")) + "\n")
    out = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(
        cli, ["profile", "--input", str(jobs), "--output", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert '"measured": 1' in result.output
    assert [r.spec.id for r in load_measurements(out)] == ["cli-1"]


@pytest.mark.gpu
def test_one_real_job_on_cuda(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    out = tmp_path / "rows.jsonl"
    job = {
        "id": "gpu-1",
        "model": "gpt2",
        "task": "inference",
        "batch_size": 4,
        "input_len": 256,
        "output_len": 16,
    }
    summary = run_profile([job], out, device="cuda", timeout_s_per_job=300)
    assert summary.measured == ["gpu-1"], _lines(skipped_path(out))
    (row,) = load_measurements(out)
    assert row.measurement == "nvml_used" and row.peak_vram_gib is not None
    assert row.gpu_model and row.hardware["driver"] and row.software["cuda"]
    # NVML sees the CUDA context and allocator slack that torch's counters do not.
    assert row.peak_vram_gib >= row.hardware["torch_max_reserved_gib"]
    assert row.hardware["cuda_context_gib"] > 0


@pytest.mark.slow
def test_spawn_isolation_gives_the_same_kind_of_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    summary = run_profile(
        [_job("s")], out, device="cpu", start_method="spawn", timeout_s_per_job=300
    )
    assert summary.measured == ["s"]
    (row,) = load_measurements(out)
    assert row.ttft_s is not None and row.gpu is None


def test_programs_the_harness_cannot_run_are_unsupported() -> None:
    """A classification head or another torch release is not what the harness trains."""
    job = {"model": "bert-large", "task": "full_finetune", "seq_len": 128}
    for extra in ({"head": "classification"}, {"torch_version": "1.10"}):
        with pytest.raises(_profile_job.UnsupportedJob, match="LM head on its own torch"):
            check_supported(parse_spec({**job, **extra}), "cpu")
    check_supported(parse_spec(job), "cpu")
    llama = {"model": "llama-3-8b", "task": "full_finetune", "seq_len": 128}
    with pytest.raises(_profile_job.UnsupportedJob, match="`transformers_version`"):
        check_supported(parse_spec({**llama, "transformers_version": "4.31"}), "cpu")
    gen = {"model": "llama-3-8b", "task": "inference", "input_len": 8, "output_len": 8}
    with pytest.raises(_profile_job.UnsupportedJob, match="`kv_cache_max_len`"):
        check_supported(parse_spec({**gen, "kv_cache_max_len": 64}), "cpu")
