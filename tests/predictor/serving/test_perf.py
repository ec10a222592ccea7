"""Invariants of the serving performance interface (``predictor.serving._perf``)."""

from __future__ import annotations

import pytest

from predictor.gpus import get_gpu
from predictor.models import resolve_model
from predictor.serving._perf import (
    Slot,
    dtype_support,
    kv_bytes_per_token,
    replica_perf,
    weight_bytes_per_gpu,
)
from predictor.spec import DType, Framework

L70 = resolve_model("llama-3.3-70b")


def test_kv_bytes_split_across_tp_until_heads_run_out() -> None:
    # 80 layers x (K+V) x 8 heads x 128 x 2 bytes = 327,680 bytes per token.
    assert kv_bytes_per_token(L70, DType.BF16, 1) == 327_680
    assert kv_bytes_per_token(L70, DType.FP8, 2) == 327_680 / 4
    # TP16 > 8 KV heads: each rank keeps one head (replicated), not half a head.
    assert kv_bytes_per_token(L70, DType.BF16, 16) == 327_680 / 8


def test_fp8_halves_and_fp4_quarters_the_body_but_not_the_embeddings() -> None:
    bf16 = weight_bytes_per_gpu(L70, DType.BF16, 1)
    fp8 = weight_bytes_per_gpu(L70, DType.FP8, 1)
    fp4 = weight_bytes_per_gpu(L70, DType.FP4, 1)
    embed = L70.embedding_params() * 2.0
    assert bf16 == pytest.approx(L70.total_params() * 2.0)
    assert fp8 - embed == pytest.approx((bf16 - embed) / 2)
    assert fp4 < fp8 < bf16 and weight_bytes_per_gpu(L70, DType.FP8, 4) == pytest.approx(fp8 / 4)


def test_decode_step_grows_with_batch_and_context_and_shrinks_with_bandwidth() -> None:
    h100 = replica_perf(L70, Slot(get_gpu("H100-80GB")), 2, DType.FP8, DType.FP8, Framework.VLLM)
    h200 = replica_perf(L70, Slot(get_gpu("H200-141GB")), 2, DType.FP8, DType.FP8, Framework.VLLM)
    steps = [h100.iteration_s(b, 1500, 0) for b in (1, 8, 64, 256)]
    assert steps == sorted(steps) and steps[-1] > 1.5 * steps[0]
    assert h100.iteration_s(64, 8000, 0) > h100.iteration_s(64, 500, 0)
    assert h200.iteration_s(8, 1500, 0) < h100.iteration_s(8, 1500, 0)
    # Batch-1 decode is memory-bound: at least the weights over HBM bandwidth.
    assert steps[0] > h100.weight_bytes / (3350e9)


def test_moe_decode_reads_only_the_routed_experts_at_small_batch() -> None:
    mav = resolve_model("llama-4-maverick")
    p = replica_perf(mav, Slot(get_gpu("H200-141GB")), 8, DType.FP8, DType.FP8, Framework.VLLM)
    one = p.iteration_s(1, 500, 0)
    full = p.weight_bytes / (4800e9 * p.constants.mbu(Framework.VLLM))
    assert one < 0.3 * full  # 1 of 128 experts per layer, not all of them


def test_mig_slice_has_its_share_of_bandwidth_compute_and_price() -> None:
    g = get_gpu("A100-80GB")
    s = Slot(g, g.mig_profile("3g.40gb"))
    assert s.memory_gib == 40.0 and s.bandwidth_share == 0.5 and s.compute_share == 3 / 7
    assert s.price_usd_per_hour == pytest.approx(g.price_usd_per_hour * 3 / 7)
    whole = replica_perf(
        resolve_model("llama-3.1-8b"), Slot(g), 1, DType.BF16, DType.BF16, Framework.VLLM
    )
    part = replica_perf(resolve_model("llama-3.1-8b"), s, 1, DType.BF16, DType.BF16, Framework.VLLM)
    assert part.iteration_s(4, 800, 0) > whole.iteration_s(4, 800, 0)


def test_dtype_support_reasons() -> None:
    assert "FP4 tensor cores" in dtype_support(get_gpu("H200-141GB"), DType.FP4, Framework.VLLM)
    assert dtype_support(get_gpu("B200-180GB"), DType.FP4, Framework.TRTLLM) == ""
    assert "TensorRT-LLM" in dtype_support(get_gpu("A100-80GB"), DType.FP8, Framework.TRTLLM)
    # vLLM runs FP8 checkpoints on Ampere as weight-only (Marlin) kernels.
    assert dtype_support(get_gpu("A100-80GB"), DType.FP8, Framework.VLLM) == ""
