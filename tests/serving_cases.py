"""Published serving measurements of issue 15, as ``tests/predictor/serving/
test_published_orderings.py`` checks them and ``benchmarks/bench_plan.py`` tabulates them
(prediction vs published): the scenario each source ran, and the prediction for it."""

from __future__ import annotations

from typing import Any

from predictor.serving import ServingPlan, replica_throughput

__all__ = ["MLPERF_70B_SERVER", "best_per_gpu_tok_s", "metrum_tok_s", "silex_tok_s"]

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
