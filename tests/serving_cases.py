"""Published serving measurements of issue 15, as ``tests/predictor/serving/
test_published_orderings.py`` checks them and ``benchmarks/bench_plan.py`` tabulates them
(prediction vs published): the scenario each source ran, and the prediction for it."""

from __future__ import annotations

from typing import Any

from predictor.serving import PlanOption, ServingPlan, plan, replica_throughput
from predictor.spec import parse_spec

__all__ = [
    "MLPERF_70B_SERVER",
    "SGLANG_VLLM_CASES",
    "best_per_gpu_tok_s",
    "metrum_tok_s",
    "sglang_vllm_option",
    "silex_tok_s",
]

#: MLPerf Inference v4.1 Llama-2-70B Server, without its GPU and weight dtype. Constraints TTFT
#: 2 s / TPOT 200 ms (MLPerf p99; snugfit plans p95). OpenOrca mean output ~290 tokens
#: (completed tokens/s / samples/s in MLPerf server logs); mean input 300 is an assumption.
MLPERF_70B_SERVER: dict[str, Any] = {
    "model": "llama-2-70b",
    "task": "serve",
    "framework": "trtllm",
    "request_rate": 100.0,
    "input_len": 300,
    "output_len": 290,
    "slo_ttft_s": 2.0,
    "slo_tpot_s": 0.2,
}


def best_per_gpu_tok_s(p: ServingPlan) -> float:
    """The plan's best output tok/s at the SLO per GPU, over its whole-GPU options."""
    return max(o.throughput_at_slo_tok_s / o.n_gpus for o in p.options if o.shape.slot.mig is None)


def silex_tok_s(gpu: str, users: int) -> float:
    """Silex Data Solutions' run: Llama-3.3-70B bf16 on 4 GPUs (TP4), 200/200 tokens, ``users``
    concurrent. The engine is not stated: vLLM assumed."""
    got = replica_throughput(
        "llama-3.3-70b", gpu, 4, "bf16", "bf16", "vllm", 200, 200, concurrency=users
    )
    return float(got["output_tok_s"])


def metrum_tok_s(gpu: str) -> float:
    """Metrum AI's run: Llama-4 Maverick on 8 GPUs with vLLM, 256/256 tokens, 1,024 concurrent.
    TP8 and FP8 weights (Meta's FP8 checkpoint) assumed; the post does not state them."""
    got = replica_throughput(
        "llama-4-maverick", gpu, 8, "fp8", "fp8", "vllm", 256, 256, concurrency=1024
    )
    return float(got["output_tok_s"])


#: ``../shared/validation`` rows sglang_bench_vllm060-0006, -0008 and -0002 (vLLM 0.6.0,
#: ShareGPT, Poisson arrivals, bf16): (model, gpu, TP, req/s, median TPOT s, median TTFT s).
SGLANG_VLLM_CASES: list[tuple[str, str, int, float, float, float]] = [
    ("llama-3.1-70b", "H100-80GB", 4, 4.0, 0.02358, 0.17915),
    ("llama-3.1-70b", "H100-80GB", 4, 8.0, 0.02915, 0.20712),
    ("llama-3.1-8b", "A100-80GB", 1, 4.0, 0.01414, 0.10048),
]


def sglang_vllm_option(model: str, gpu: str, tp: int, rate: float) -> PlanOption:
    """The plan's whole-GPU TP=``tp`` option for one SGLang-benchmark case, with no SLO.
    ShareGPT's mean output is 194 tokens (3,700.64 tok/s / 19.04 req/s, row -0012); the mean
    input (230) is an assumption, the row does not give it."""
    spec = {
        "model": model,
        "task": "serve",
        "request_rate": rate,
        "input_len": 230,
        "output_len": 194,
        "gpu": gpu,
        "tensor_parallel": tp,
        "slo_ttft_s": None,
        "slo_tpot_s": None,
    }
    options = plan(parse_spec(spec)).options
    (o,) = [x for x in options if x.shape.slot.mig is None and x.shape.tp == tp]
    return o
