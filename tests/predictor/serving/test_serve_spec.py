"""`task: serve` in the JobSpec contract: fields, defaults and clear errors."""

from __future__ import annotations

import json

import pytest

from predictor import analytical
from predictor.exceptions import SpecError
from predictor.spec import DType, Framework, Task, parse_spec

SERVE = {"model": "llama-3.1-8b", "task": "serve", "request_rate": 2.0}


def test_serve_defaults_are_documented_and_filled() -> None:
    s = parse_spec(SERVE)
    assert s.task is Task.SERVE and not s.task.is_training
    assert s.framework is Framework.VLLM
    assert s.n_gpus == s.tensor_parallel == 1
    assert (s.input_len, s.output_len) == (512, 256)
    assert s.max_model_len == 4096  # max(4096, 2 x (512 + 256)), below the 131072 context
    # Llama-3.1-8B takes the MLPerf interactive 8B tier.
    assert (s.slo_ttft_s, s.slo_tpot_s) == (0.5, 0.030)
    assert s.weight_dtype is DType.BF16 and s.num_requests is None


def test_70b_class_default_slo_is_the_mlperf_interactive_tier() -> None:
    s = parse_spec({**SERVE, "model": "llama-2-70b"})
    assert (s.slo_ttft_s, s.slo_tpot_s) == (0.45, 0.040)


def test_explicit_null_slo_means_no_target() -> None:
    s = parse_spec({**SERVE, "slo_ttft_s": None})
    assert s.slo_ttft_s is None and s.slo_tpot_s == 0.030


def test_serve_spec_round_trips_through_json() -> None:
    s = parse_spec({**SERVE, "allowed_weight_dtypes": ["bf16", "fp8"], "duration_s": 3600})
    again = parse_spec(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.allowed_weight_dtypes == (DType.BF16, DType.FP8)


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ({"request_rate": 0}, ["`request_rate` must be > 0", "got 0", "Example"]),
        ({"request_rate": -1.5}, ["`request_rate` must be > 0", "-1.5"]),
        ({"request_rate": None}, ["`request_rate` is required"]),
        ({"allowed_weight_dtypes": ["bf16", "fp3"]}, ["`allowed_weight_dtypes`", "'fp3'", "fp8"]),
        ({"weight_dtype": "fp3"}, ["`weight_dtype`", "fp3"]),
        (
            {"weight_dtype": "fp4", "gpu": "H100-80GB"},
            ["`weight_dtype` fp4", "H100-80GB", "FP4 tensor cores", "B200-180GB"],
        ),
        ({"num_requests": 10}, ["`num_requests` does not apply to `serve`", "request_rate"]),
        ({"n_gpus": 8}, ["`n_gpus`", "n_gpus=8", "tensor_parallel=1"]),
        ({"max_model_len": 100}, ["`max_model_len` 100", "768"]),
        ({"slo_tpot_s": 0}, ["`slo_tpot_s` must be > 0"]),
        ({"kv_cache_dtype": "int4"}, ["`kv_cache_dtype` int4", "fp8"]),
        ({"framework": "deepspeed"}, ["`framework` 'deepspeed'", "vllm"]),
        ({"model": "bert-base-uncased"}, ["encoder-only", "task `inference`"]),
        (
            {"weight_dtype": "fp8", "allowed_weight_dtypes": ["bf16"]},
            ["`weight_dtype` fp8 is not in `allowed_weight_dtypes`"],
        ),
    ],
)
def test_bad_serve_input_names_field_value_and_fix(extra: dict, needles: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**SERVE, **extra})
    for needle in needles:
        assert needle in str(err.value)


def test_serve_fields_are_rejected_on_other_tasks() -> None:
    with pytest.raises(SpecError, match="`request_rate` does not apply to `inference`"):
        parse_spec({"model": "llama-3.1-8b", "task": "inference", "request_rate": 1.0})
    with pytest.raises(SpecError, match="use task `serve`"):
        parse_spec({"model": "llama-3.1-8b", "task": "lora", "slo_ttft_s": 1.0})


def test_predict_answers_a_serve_spec_as_one_replica() -> None:
    s = parse_spec({**SERVE, "batch_size": 16, "id": "svc"})
    inf = parse_spec(
        {
            "model": "llama-3.1-8b",
            "task": "inference",
            "framework": "vllm",
            "batch_size": 16,
            "input_len": 512,
            "output_len": 256,
        }
    )
    got, ref = analytical.predict([s, inf], ["H100-80GB"])
    assert got.fits and got.peak_vram_gib == pytest.approx(ref.peak_vram_gib)
    assert got.tpot_s == pytest.approx(ref.tpot_s) and got.runtime_s > 0


def test_tiered_predictor_answers_a_serve_spec() -> None:
    from predictor.tiered import default_predictor

    (got,) = default_predictor().predict([parse_spec({**SERVE, "id": "svc"})], ["A100-80GB"])
    assert got.fits and got.tpot_s is not None and got.step_time_s is None
