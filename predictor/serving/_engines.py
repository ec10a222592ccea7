"""Serving engines: how each sizes its KV-cache pool, and the flags that realise a plan.

Memory semantics (per GPU), as each engine documents them:

* vLLM: ``--gpu-memory-utilization`` (default 0.9) of the whole GPU must hold the weights,
  the profiled activation peak, CUDA graphs and non-torch memory; the KV blocks get the rest.
* SGLang: ``--mem-fraction-static`` (we plan with 0.88) of the GPU holds the weights plus
  the KV pool; activations and CUDA graphs live in the remainder.
* TensorRT-LLM: ``kv_cache_free_gpu_memory_fraction`` (default 0.9) of the memory *left
  after* the engine (weights, activations, context) is loaded.
* HF (transformers / TGI): no paged pool; planned like vLLM at 0.9 so the numbers compare.

The activation peak is one chunk of ``max_num_batched_tokens`` (8192, chunked prefill) through
one layer plus sampler logits for every running sequence; CUDA context and graph memory come
from :class:`predictor._memory.MemoryModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._memory import MemoryModel
from ..models import ModelArch
from ..spec import DType, Framework
from ._perf import Slot

__all__ = [
    "ENGINE_BATCH_CAP",
    "ENGINE_PLACEHOLDERS",
    "PREFILL_CHUNK_TOKENS",
    "KvBudget",
    "engine_flags",
    "engine_values",
    "kv_budget",
    "tokens_per_sequence",
]

GIB = float(1024**3)
PREFILL_CHUNK_TOKENS = 8192
KV_BLOCK_TOKENS = 16

#: Largest running batch each engine is planned with (vLLM/SGLang capture CUDA graphs up to
#: a few hundred sequences and run larger batches eagerly; trtllm-bench goes to 2048).
ENGINE_BATCH_CAP: dict[Framework, int] = {
    Framework.VLLM: 1024,
    Framework.SGLANG: 1024,
    Framework.TRTLLM: 2048,
    Framework.HF: 256,
}

_MEMORY_FRACTION: dict[Framework, float] = {
    Framework.VLLM: 0.90,
    Framework.SGLANG: 0.88,
    Framework.TRTLLM: 0.90,
    Framework.HF: 0.90,
}


@dataclass(frozen=True, slots=True)
class KvBudget:
    """Per-GPU memory plan of one replica, GiB, and the KV tokens it leaves."""

    weights_gib: float
    activations_gib: float
    fixed_gib: float  # CUDA context, CUDA graphs, NCCL buffers
    kv_pool_gib: float
    kv_tokens: int
    memory_fraction: float


def _activation_bytes(arch: ModelArch, tp: int, max_seqs: int) -> float:
    a = 2.0
    ffn = arch.expert_intermediate_size * (
        arch.n_active_experts + arch.n_shared_experts if arch.is_moe else 1
    )
    gated = 1.0 if arch.gated_mlp else 0.0
    per_token = a * (3.0 * arch.hidden_size + ffn * (1.0 + 2.0 * gated))
    logits = max_seqs * arch.vocab_size * 4.0
    return (PREFILL_CHUNK_TOKENS * per_token + logits) / tp


def kv_budget(
    arch: ModelArch,
    slot: Slot,
    tp: int,
    framework: Framework,
    weight_bytes_per_gpu: float,
    kv_bytes_per_token: float,
    max_seqs: int,
    mm: MemoryModel | None = None,
) -> KvBudget:
    mm = mm or MemoryModel()
    total = slot.memory_gib * GIB
    acts = _activation_bytes(arch, tp, max_seqs)
    fixed = (mm.context_gib(slot.gpu.name) + mm.serving_engine_extra_gib) * GIB
    if tp > 1:
        fixed += mm.nccl_buffers_gib * GIB
    frac = _MEMORY_FRACTION.get(framework, 0.9)
    if framework is Framework.SGLANG:
        pool = frac * total - weight_bytes_per_gpu
        pool = min(pool, total - weight_bytes_per_gpu - acts - fixed)
    elif framework is Framework.TRTLLM:
        pool = frac * (total - weight_bytes_per_gpu - acts - fixed)
    else:
        pool = frac * total - weight_bytes_per_gpu - acts - fixed
    pool = max(pool, 0.0)
    tokens = int(pool // kv_bytes_per_token) if kv_bytes_per_token > 0 else 0
    tokens -= tokens % KV_BLOCK_TOKENS
    return KvBudget(
        weights_gib=weight_bytes_per_gpu / GIB,
        activations_gib=acts / GIB,
        fixed_gib=fixed / GIB,
        kv_pool_gib=pool / GIB,
        kv_tokens=max(tokens, 0),
        memory_fraction=frac,
    )


def tokens_per_sequence(input_len: int, output_len: int) -> int:
    """KV tokens a request holds at its end, rounded up to whole 16-token blocks."""
    n = input_len + output_len
    return int(math.ceil(n / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS)


_VLLM_QUANT: dict[DType, str] = {
    DType.FP8: "fp8",
    DType.FP4: "modelopt_fp4",
    DType.INT8: "compressed-tensors",
    DType.INT4: "awq",
    DType.NF4: "bitsandbytes",
}
_SGLANG_QUANT: dict[DType, str] = {
    DType.FP8: "fp8",
    DType.FP4: "modelopt_fp4",
    DType.INT8: "w8a8_int8",
    DType.INT4: "awq",
}


#: Names of the values a replica's ``command`` may use as ``{placeholders}`` (and as
#: ``SNUGFIT_<NAME_UPPER>`` environment variables); the worker substitutes them.
ENGINE_PLACEHOLDERS: tuple[str, ...] = (
    "gpu_memory_utilization",
    "mem_fraction_static",
    "kv_cache_free_gpu_memory_fraction",
    "tensor_parallel_size",
    "max_num_seqs",
    "max_model_len",
    "kv_cache_dtype",
    "quantization",
)


def engine_values(
    framework: Framework, tp: int, max_batch: int, max_model_len: int, weight: DType, kv: DType
) -> dict[str, str]:
    """The placeholder values that realise one option, as strings (vLLM's spelling for the
    dtypes; ``quantization`` is empty for unquantised weights). ``framework`` picks the
    quantisation method's name where engines differ."""
    quant = (_SGLANG_QUANT if framework is Framework.SGLANG else _VLLM_QUANT).get(weight, "")
    return {
        "gpu_memory_utilization": f"{_MEMORY_FRACTION[Framework.VLLM]:.2f}",
        "mem_fraction_static": f"{_MEMORY_FRACTION[Framework.SGLANG]:.2f}",
        "kv_cache_free_gpu_memory_fraction": f"{_MEMORY_FRACTION[Framework.TRTLLM]:.2f}",
        "tensor_parallel_size": str(tp),
        "max_num_seqs": str(max_batch),
        "max_model_len": str(max_model_len),
        "kv_cache_dtype": "fp8" if kv is DType.FP8 else "auto",
        "quantization": quant,
    }


def engine_flags(
    framework: Framework,
    model: str,
    tp: int,
    max_batch: int,
    max_model_len: int,
    weight: DType,
    kv: DType,
) -> dict[str, list[str]]:
    """argv for vLLM, SGLang and TensorRT-LLM (the planned framework first) for one replica."""
    vllm = ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]
    vllm += ["--gpu-memory-utilization", f"{_MEMORY_FRACTION[Framework.VLLM]:.2f}"]
    vllm += ["--max-num-seqs", str(max_batch), "--max-model-len", str(max_model_len)]
    vllm += ["--kv-cache-dtype", "fp8" if kv is DType.FP8 else "auto"]
    if weight in _VLLM_QUANT:
        vllm += ["--quantization", _VLLM_QUANT[weight]]
    sglang = ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(tp)]
    sglang += ["--mem-fraction-static", f"{_MEMORY_FRACTION[Framework.SGLANG]:.2f}"]
    sglang += ["--max-running-requests", str(max_batch), "--context-length", str(max_model_len)]
    sglang += ["--kv-cache-dtype", "fp8_e4m3" if kv is DType.FP8 else "auto"]
    if weight in _SGLANG_QUANT:
        sglang += ["--quantization", _SGLANG_QUANT[weight]]
    # TensorRT-LLM reads the weight format and the KV-cache dtype from the quantised checkpoint
    # (ModelOpt's quant_algo / kv_cache_quant_algo), so there is no flag for either: serve the
    # FP8 / NVFP4 ModelOpt checkpoint of the model.
    trt = ["trtllm-serve", model, "--tp_size", str(tp), "--max_batch_size", str(max_batch)]
    trt += ["--max_seq_len", str(max_model_len), "--kv_cache_free_gpu_memory_fraction"]
    trt += [f"{_MEMORY_FRACTION[Framework.TRTLLM]:.2f}"]
    out = {"vllm": vllm, "sglang": sglang, "trtllm": trt}
    if framework is Framework.HF:
        hf = ["text-generation-launcher", "--model-id", model, "--num-shard", str(tp)]
        hf += ["--max-batch-size", str(max_batch), "--max-total-tokens", str(max_model_len)]
        if weight is DType.FP8:
            hf += ["--quantize", "fp8"]
        out = {"hf": hf, **out}
    first = framework.value
    return {first: out[first], **{k: v for k, v in out.items() if k != first}}
