"""Issue 15's done-when checks: `snugfit plan` against published serving measurements.

None of these figures was used to fit the model's constants: ``benchmarks/fit_serving.py`` fits
six global constants on TensorRT-LLM perf-overview v1.0 rows that *exclude* the Llama-3.3-70B
1000/1000 cells below (other ISL/OSL cells of the same source and GPUs are in the fit, so that
check is held out by cell, not by source), plus three NIM latencies. MLPerf, Silex and Metrum
are held out entirely. Each check asserts the ordering; a figure is within 25% or the test
states the gap and why.
"""

from __future__ import annotations

import pytest

from predictor.serving import plan
from predictor.spec import parse_spec
from tests.serving_cases import (
    MLPERF_70B_SERVER,
    SGLANG_VLLM_CASES,
    best_per_gpu_tok_s,
    metrum_tok_s,
    sglang_vllm_option,
    silex_tok_s,
)

WITHIN = 0.25


def _close(pred: float, measured: float) -> bool:
    return abs(pred / measured - 1.0) <= WITHIN


def _max_load(gpu: str, tp: int, weight: str, model: str, i: int, o: int, fw: str) -> float:
    """`snugfit plan`'s max output tok/s of one replica, for a pinned shape."""
    spec = parse_spec(
        {
            "model": model,
            "task": "serve",
            "framework": fw,
            "request_rate": 1.0,
            "input_len": i,
            "output_len": o,
            "gpu": gpu,
            "tensor_parallel": tp,
            "weight_dtype": weight,
            "kv_cache_dtype": "fp8",
            "slo_ttft_s": None,
            "slo_tpot_s": None,
        }
    )
    (o,) = [x for x in plan(spec).options if x.shape.slot.mig is None and x.shape.tp == tp]
    return o.max_throughput_tok_s


def test_trtllm_perf_overview_llama33_70b_1000_1000_max_load() -> None:
    # TensorRT-LLM perf overview (v1.0), total output tok/s at max load, as quoted in issue 15
    # (the B200 cell is also row trtllm_perf_overview_v1.0 in ../shared/validation).
    measured = {"B200 TP1 FP4": 7007.0, "H200 TP1 FP8": 2909.0, "H100 TP2 FP8": 4205.0}
    got = {
        "B200 TP1 FP4": _max_load("B200-180GB", 1, "fp4", "llama-3.3-70b", 1000, 1000, "trtllm"),
        "H200 TP1 FP8": _max_load("H200-141GB", 1, "fp8", "llama-3.3-70b", 1000, 1000, "trtllm"),
        "H100 TP2 FP8": _max_load("H100-80GB", 2, "fp8", "llama-3.3-70b", 1000, 1000, "trtllm"),
    }
    # Predicted at the fitted constants: 7,072 / 2,627 / 4,706 (+1%, -10%, +12%).
    assert got["B200 TP1 FP4"] > got["H100 TP2 FP8"] > got["H200 TP1 FP8"]
    for key, value in measured.items():
        assert _close(got[key], value), (key, got[key], value)


def test_mlperf_v41_llama2_70b_server_b200_fp4_vs_h200() -> None:
    # MLPerf Inference v4.1 Llama-2-70B Server: 1x B200 FP4 10,755 tok/s (validation row
    # mlperf_inf_v4.1_llama2_70b-0002) vs an 8x H200 system at ~4,100 per GPU (issue 15;
    # the stored rows give 3,717/GPU for an 8x H200 submission and 4,202 for 1x H200).
    # Scenario and its assumptions: tests.serving_cases.MLPERF_70B_SERVER.
    base = MLPERF_70B_SERVER
    b200 = plan(parse_spec({**base, "gpu": "B200-180GB", "weight_dtype": "fp4"}))
    h200 = plan(parse_spec({**base, "gpu": "H200-141GB", "weight_dtype": "fp8"}))
    b, h = best_per_gpu_tok_s(b200), best_per_gpu_tok_s(h200)
    ratio, measured_ratio = b / h, 10755.0 / 4100.0
    assert b > h and _close(ratio, measured_ratio), (b, h, ratio)  # 2.61 vs 2.62
    # Known gap: both absolute figures are ~28% low (7,714 vs 10,755; 2,953 vs 4,100). The
    # fitted GEMM efficiencies come from the perf-overview defaults, which NVIDIA says are not
    # peak; MLPerf submissions are hand-tuned. The ratio, which the choice depends on, holds.
    assert 0.62 < b / 10755.0 < 0.85 and 0.62 < h / 4100.0 < 0.85, (b, h)


def test_silex_llama33_70b_bf16_tp4_a100_vs_h100() -> None:
    # Silex Data Solutions (as quoted in issue 15; not in ../shared/validation), 200/200 bf16
    # TP4: 4x A100 saturates near 570 tok/s at 50 users, 4x H100 reaches ~7,000 at 500 users.
    # Engine not stated in the quote: vLLM assumed; A100-80GB assumed.
    a100, h100 = silex_tok_s("A100-80GB", 50), silex_tok_s("H100-80GB", 500)
    assert h100 > a100
    assert _close(h100, 7000.0), h100  # 6,803 (-3%)
    predicted_ratio, measured_ratio = h100 / a100, 7000.0 / 570.0
    # Stated gap: predicted 5.2x vs measured 12.3x. The A100 figure is 2.3x below what the
    # roofline allows (50 sequences on 4x 2 TB/s over 35 GB of weights per GPU is >= 25 ms per
    # step, i.e. ~1,300 tok/s): it implies ~88 ms per token, which no bandwidth-bound model of
    # an A100-80GB SXM reproduces without a per-source correction we do not fit.
    assert 4.0 < predicted_ratio < 7.0 and measured_ratio > predicted_ratio
    assert 1.8 < a100 / 570.0 < 2.8, a100


def test_metrum_llama4_maverick_8xb200_vs_8xh200_vllm() -> None:
    # Metrum AI (metrum.ai blog "llama-h200-v-b200-performance"): vLLM, 256/256 tokens, 1,024
    # concurrent: 8x B200 9,870 vs 8x H200 6,694 output tok/s (+47%). TP8 and FP8 weights
    # (Meta's FP8 Maverick checkpoint) assumed; the post does not state them.
    b, h = metrum_tok_s("B200-180GB"), metrum_tok_s("H200-141GB")
    assert b > h and _close(b / h, 9870.0 / 6694.0), b / h  # 1.50 vs 1.47
    # Stated gap: both absolute figures are ~4x above Metrum's (41.9k vs 9.9k; 27.9k vs 6.7k).
    # TensorRT-LLM on the same 8x B200 reaches 79,617 tok/s at 1000/1000 (perf overview), so
    # the measured run is far from the hardware's roofline (early vLLM Llama-4 MoE kernels, or
    # a client-bound benchmark). One source cannot pin a framework x model efficiency; the
    # B200/H200 ratio, which drives the choice, holds.
    assert 3.0 < b / 9870.0 < 5.5 and 3.0 < h / 6694.0 < 5.5, (b, h)


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "rate", "tpot_median_s", "ttft_median_s"), SGLANG_VLLM_CASES
)
def test_latency_at_rate_against_sglang_benchmark_of_vllm(
    model: str, gpu: str, tp: int, rate: float, tpot_median_s: float, ttft_median_s: float
) -> None:
    # The cases and the workload's assumptions: tests.serving_cases.
    o = sglang_vllm_option(model, gpu, tp, rate)
    assert o.replicas == 1
    # The mean step time at the load is the median TPOT's estimate: within 25% (-15%..+10%).
    assert _close(o.point.step_s, tpot_median_s), o.point.step_s
    # Stated gap: predicted TTFT *p95* is 40-55 ms, below vLLM 0.6.0's measured *median*
    # (100-207 ms). The model has no per-request front-end cost (HTTP, tokenising, vLLM 0.6's
    # scheduler); SGLang on the same 70B workload measured a 54 ms median (row -0005).
    assert o.point.ttft_p95_s < ttft_median_s
