from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictor.analytical import predict, predict_table
from predictor.gpus import GPU_NAMES
from predictor.prediction import BREAKDOWN_KEYS
from predictor.spec import parse_spec

GIB = 1024**3


def one(data: dict, gpu: str = "H100-80GB"):  # type: ignore[no-untyped-def]
    return predict([parse_spec(data)], [gpu])[0]


INFER = {
    "model": "llama-3.1-8b",
    "task": "inference",
    "batch_size": 4,
    "input_len": 1000,
    "output_len": 24,
}
FT = {"model": "llama-2-7b", "task": "full_finetune", "batch_size": 2, "seq_len": 1024}
ALL_TASKS = [
    INFER,
    {**INFER, "framework": "vllm"},
    FT,
    {**FT, "task": "pretrain"},
    {**FT, "task": "lora"},
    {**FT, "task": "qlora"},
]


@pytest.mark.parametrize("data", ALL_TASKS)
def test_contract_fields_for_every_task(data: dict) -> None:
    preds = predict([parse_spec(data)])
    assert [p.gpu for p in preds] == list(GPU_NAMES)
    for p in preds:
        assert set(p.breakdown_gib) == set(BREAKDOWN_KEYS)
        assert sum(p.breakdown_gib.values()) == pytest.approx(p.peak_vram_gib, abs=0.01)
        assert p.peak_vram_upper_gib >= p.peak_vram_gib > 0
        assert p.runtime_upper_s >= p.runtime_s > 0
        if data["task"] == "inference":
            assert p.ttft_s and p.tpot_s and p.step_time_s is None
        else:
            assert p.step_time_s and p.ttft_s is None and p.tpot_s is None
            assert p.runtime_s == pytest.approx(p.step_time_s * 1000, rel=1e-3)


def test_weights_and_kv_cache_match_hand_arithmetic() -> None:
    p = one(INFER)
    from predictor.models import resolve_model

    arch = resolve_model("llama-3.1-8b")
    assert p.breakdown_gib["weights"] == pytest.approx(arch.total_params() * 2 / GIB, rel=1e-3)
    kv = 2 * 32 * 8 * 128 * 2 * 4 * 1024 / GIB  # K+V, layers, kv heads, head dim, bf16, batch, ctx
    assert p.breakdown_gib["kv_cache"] == pytest.approx(kv, rel=1e-6)


def test_memory_moves_the_right_way() -> None:
    base = one(FT).peak_vram_gib
    lora = {**FT, "task": "lora"}
    assert one({**lora, "batch_size": 4}).peak_vram_gib > one(lora).peak_vram_gib
    # Full fine-tunes peak at the optimizer step until activations outgrow the gradients.
    assert one({**FT, "batch_size": 16}).peak_vram_gib > base
    lora_ft = {**FT, "task": "lora"}
    ckpt = one({**lora_ft, "gradient_checkpointing": True}).breakdown_gib["activations"]
    assert 0 < ckpt < one(lora_ft).breakdown_gib["activations"] / 4
    lora = one({**FT, "task": "lora"}).peak_vram_gib
    qlora = one({**FT, "task": "qlora"}).peak_vram_gib
    assert qlora < lora < base
    zero3 = one({**FT, "n_gpus": 8, "zero_stage": 3}).breakdown_gib
    assert zero3["optimizer"] < one(FT).breakdown_gib["optimizer"] / 4
    tp2 = one({**INFER, "n_gpus": 2, "tensor_parallel": 2}).breakdown_gib["weights"]
    assert tp2 == pytest.approx(one(INFER).breakdown_gib["weights"] / 2, rel=0.05)
    assert one({**FT, "optimizer": "adamw_8bit"}).peak_vram_gib < base
    assert one({**INFER, "kv_cache_dtype": "fp8"}).breakdown_gib["kv_cache"] == pytest.approx(
        one(INFER).breakdown_gib["kv_cache"] / 2
    )


def test_runtime_follows_the_hardware() -> None:
    ft = {g: one(FT, g).step_time_s for g in GPU_NAMES}
    assert ft["A100-80GB"] > ft["H100-80GB"] > ft["B200-180GB"]
    dec = {g: one(INFER, g).tpot_s for g in GPU_NAMES}
    assert (
        dec["A100-40GB"]
        > dec["A100-80GB"]
        > dec["H100-80GB"]
        > dec["H200-141GB"]
        > dec["B200-180GB"]
    )
    # H200 has H100's compute: prefill of a big batch is about as fast.
    big = {**INFER, "batch_size": 32, "input_len": 4096, "framework": "vllm"}
    assert one(big, "H200-141GB").ttft_s == pytest.approx(one(big, "H100-80GB").ttft_s, rel=0.05)


def test_fits_uses_the_upper_bound_against_capacity() -> None:
    p = one({"model": "llama-3.1-70b", "task": "inference"}, "A100-80GB")
    assert not p.fits and p.peak_vram_gib > 80
    assert one({"model": "llama-3.1-70b", "task": "inference"}, "B200-180GB").fits


def test_pinned_gpu_only() -> None:
    preds = predict([parse_spec({**INFER, "gpu": "A100-40GB"})])
    assert [p.gpu for p in preds] == ["A100-40GB"]


def test_vectorised_equals_one_at_a_time() -> None:
    specs = [parse_spec(d) for d in ALL_TASKS]
    table = predict_table(specs)
    for i, s in enumerate(specs):
        single = predict_table([s])
        np.testing.assert_allclose(table.peak_vram_gib[i], single.peak_vram_gib[0])
        np.testing.assert_allclose(table.runtime_s[i], single.runtime_s[0])


def test_busy_fraction_separates_launch_bound_from_saturating_jobs() -> None:
    small = parse_spec({"model": "qwen2.5-0.5b", "task": "inference", "batch_size": 1})
    served = parse_spec(
        {"model": "llama-3.1-8b", "task": "inference", "framework": "vllm", "batch_size": 64}
    )
    t = predict_table([small, served])
    assert t.busy_frac is not None
    assert np.all((t.busy_frac >= 0) & (t.busy_frac <= 1))
    # Eager small-batch decoding is launch-bound; a big vLLM batch mostly saturates HBM (the
    # engine's per-step CPU work, which a MIG slice does not stretch, is the rest).
    assert np.all(t.busy_frac[0] < 0.3) and np.all(t.busy_frac[1] > 0.5)
    assert np.all(t.busy_frac[1] > 3 * t.busy_frac[0])


def test_hf_generate_charges_last_token_logits_only() -> None:
    from predictor import analytical
    from predictor.spec import parse_spec

    base = {"model": "llama-3.1-8b", "task": "inference", "batch_size": 8, "output_len": 128}
    short = analytical.predict_table([parse_spec({**base, "input_len": 128})], ["H100-80GB"])
    long = analytical.predict_table([parse_spec({**base, "input_len": 1024})], ["H100-80GB"])
    # b × V × (bf16 + fp32), whatever the prompt length
    assert short.breakdown_gib["logits"][0, 0] == long.breakdown_gib["logits"][0, 0]
    assert long.breakdown_gib["logits"][0, 0] < 8 * 128256 * 6 / 2**30 * 1.01


def test_peft_fp32_adapters_keep_input_copies() -> None:
    from predictor import analytical
    from predictor.spec import parse_spec

    job = {"model": "llama-3.1-8b", "task": "lora", "batch_size": 2, "seq_len": 2048}
    fp32 = analytical.predict_table([parse_spec(job)], ["H100-80GB"])
    bf16 = analytical.predict_table([parse_spec({**job, "adapter_dtype": "bf16"})], ["H100-80GB"])
    assert fp32.breakdown_gib["activations"][0, 0] > 1.2 * bf16.breakdown_gib["activations"][0, 0]
    assert fp32.breakdown_gib["optimizer"][0, 0] == 2 * bf16.breakdown_gib["optimizer"][0, 0]


def _part_gib(job: dict[str, Any], key: str, *, on: str = "H100-80GB", **kw: Any) -> float:
    """One breakdown component of ``job`` with ``kw`` set, on GPU type ``on``."""
    return float(predict_table([parse_spec({**job, **kw})], [on]).breakdown_gib[key][0, 0])


def test_zeroed_not_freed_gradients_are_alive_at_the_start_of_backward() -> None:
    """torch < 2.0's ``zero_grad()`` zeroes the gradients: at the start of backward all of
    them are alive (only the head's is when they are freed), as with gradient accumulation."""
    job = {"model": "bert-large", "task": "full_finetune", "batch_size": 4, "seq_len": 512}
    job |= {"weight_dtype": "fp32", "compute_dtype": "fp32", "optimizer": "adafactor"}

    def grads(**kw: Any) -> float:
        return _part_gib(job, "gradients", **kw)

    accumulated = grads(gradient_accumulation=2)
    assert grads(zero_grad_set_to_none=False) == pytest.approx(accumulated)
    assert grads() < 0.25 * accumulated


def test_classification_head_and_old_torch_softmax() -> None:
    """A classification head has no vocabulary logits; torch < 1.11 keeps each softmax input
    (4 bytes per score of every layer in fp32)."""
    job = {"model": "bert-large", "task": "full_finetune", "batch_size": 4, "seq_len": 512}
    job |= {"weight_dtype": "fp32", "compute_dtype": "fp32", "optimizer": "adafactor"}

    def part(key: str, **kw: Any) -> float:
        return _part_gib(job, key, **kw) * 2**30

    assert part("logits") > 0 and part("logits", head="classification") == 0
    extra = part("activations", torch_version="1.10") - part("activations")
    assert extra == pytest.approx(24 * 4 * 16 * 512 * 512 * 4, rel=1e-6)


def test_lora_dropout_masks_and_eager_attention_scores() -> None:
    job = {"model": "llama-2-7b", "task": "lora", "batch_size": 4, "seq_len": 2048}
    job |= {"lora_target": "qv", "lora_rank": 8}

    def acts(**kw: Any) -> float:
        return _part_gib(job, "activations", **kw) * 2**30

    # one 1-byte mask per adapted input (q and v: 2 x 4096 wide) per token and layer
    assert acts(lora_dropout=0.05) - acts() == pytest.approx(32 * 4 * 2048 * 2 * 4096, rel=1e-6)
    # eager attention: at least the bf16 softmax and its fp32 upcast per score, every layer
    assert acts(attn_implementation="eager") - acts() >= 32 * 4 * 32 * 2048**2 * 6


def test_preallocated_and_query_head_kv_cache() -> None:
    job = {"model": "llama-3-8b", "task": "inference", "input_len": 6, "output_len": 206}
    job |= {"weight_dtype": "bf16"}

    def kv(**kw: Any) -> float:
        return _part_gib(job, "kv_cache", on="A100-80GB", **kw)

    per_token = 32 * 2 * 8 * 128 * 2 / GIB  # layers x K,V x 8 KV heads x head_dim x bf16
    assert kv() == pytest.approx(per_token * 212)
    assert kv(kv_cache_max_len=4096) == pytest.approx(per_token * 4096)
    # torchtune @20747cd87: K/V expanded to the 32 query heads before caching
    both = kv(kv_cache_max_len=4096, kv_cache_query_heads=True)
    assert both == pytest.approx(per_token * 4096 * 32 / 8)


def test_transformers_before_4_50_adds_the_shifted_fp32_logits_copy() -> None:
    job = {"model": "llama-2-7b", "task": "full_finetune", "batch_size": 4, "seq_len": 2048}

    def logits(**kw: Any) -> float:
        return _part_gib(job, "logits", on="A100-80GB", **kw)

    copy = 4 * 2048 * 32000 * 4 / GIB  # b x s x vocab fp32
    assert logits(transformers_version="4.31") - logits() == pytest.approx(copy)
    assert logits(transformers_version="4.50") == logits()


def test_use_cache_in_training_adds_every_layers_k_and_v() -> None:
    job = {"model": "llama-2-7b", "task": "lora", "batch_size": 4, "seq_len": 2048}
    job |= {"gradient_checkpointing": True, "weight_dtype": "bf16"}
    kv = 32 * 2 * 4096 * 2 * 4 * 2048 / GIB  # layers x K,V x kv width x bf16 x tokens
    assert _part_gib(job, "kv_cache", on="A100-80GB", use_cache=True) == pytest.approx(kv)
    assert _part_gib(job, "kv_cache", on="A100-80GB") == 0.0
