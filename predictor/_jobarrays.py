"""Specs as a struct of numpy arrays, so the memory and runtime maths vectorise over jobs.

Extraction is the only per-job Python loop in the analytical tier; everything architecture-
derived is cached per ``ModelArch`` because real workloads repeat a handful of models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ._spec_rules import saves_softmax_input, shifts_fp32_logits
from .models import ModelArch
from .spec import AttnImplementation, DType, Framework, Head, JobSpec, Optimizer, Task

__all__ = [
    "DTYPES",
    "FRAMEWORKS",
    "NF4_SINGLE_QUANT_BYTES",
    "OPTIMIZERS",
    "TASKS",
    "JobArrays",
    "job_arrays",
    "qbytes",
    "weight_qbytes",
]

TASKS: tuple[Task, ...] = tuple(Task)
FRAMEWORKS: tuple[Framework, ...] = tuple(Framework)
OPTIMIZERS: tuple[Optimizer, ...] = tuple(Optimizer)
DTYPES: tuple[DType, ...] = tuple(DType)

# Bytes per stored weight element *including* quantisation scales:
# int4 = GPTQ/AWQ group-128 (fp16 scale + 4-bit zero per group); nf4 = bitsandbytes blocksize 64
# with double quantisation (8-bit absmax + fp32 per 256 blocks); fp4 = NVFP4 (fp8 scale per 16);
# int8 = per-channel fp16 scales (negligible per element).
_QBYTES: dict[DType, float] = {
    DType.FP32: 4.0,
    DType.BF16: 2.0,
    DType.FP16: 2.0,
    DType.FP8: 1.0,
    DType.INT8: 1.0,
    DType.INT4: 0.5 + 2.5 / 128,
    DType.NF4: 0.5 + 1.0 / 64 + 4.0 / (64 * 256),
    DType.FP4: 0.5 + 1.0 / 16,
}


#: nf4 without double quantisation: one fp32 absmax per 64 weights.
NF4_SINGLE_QUANT_BYTES = 0.5 + 4.0 / 64


def qbytes(dtype: DType) -> float:
    return _QBYTES[dtype]


def weight_qbytes(spec: JobSpec) -> float:
    """Bytes per stored weight of the spec's ``weight_dtype`` (nf4 per ``double_quant``)."""
    weight = spec.weight_dtype or DType.BF16
    if weight is DType.NF4 and spec.double_quant is False:
        return NF4_SINGLE_QUANT_BYTES
    return _QBYTES[weight]


@dataclass(frozen=True, slots=True)
class _ArchNumbers:
    n_layers: float
    hidden: float
    n_heads: float
    attn_dim: float  # n_heads * head_dim (query width)
    kv_dim: float  # KV-cache elements per token per layer
    kv_width: float  # K+V projection output width (activations)
    ffn: float  # MLP width a token passes through per layer (sum over active experts)
    gated: float
    vocab: float
    total_params: float
    embed_params: float  # input embedding (+ untied head, + learned positions)
    input_embed_params: float  # the lookup table only: no matmul FLOPs
    active_params: float
    flop_params: float  # params that cost 2 FLOPs per token in a matmul
    expert_params: float
    n_experts: float
    n_active_experts: float
    layer_params: float  # largest-ish layer, for ZeRO-3 gather buffers
    is_moe: float
    encoder_only: float


@lru_cache(maxsize=4096)
def _arch_numbers(arch: ModelArch) -> _ArchNumbers:
    total = arch.total_params()
    embed = arch.embedding_params()
    input_embed = arch.vocab_size * arch.hidden_size
    active = arch.active_params()
    # The lm head matmul runs even when tied; the input lookup costs no FLOPs.
    flop_params = arch.active_params(include_input_embedding=False)
    if arch.tie_embeddings:
        flop_params += arch.vocab_size * arch.hidden_size
    experts_per_token = arch.n_active_experts + arch.n_shared_experts if arch.is_moe else 1
    width = arch.expert_intermediate_size if arch.is_moe else arch.intermediate_size
    ffn = width * experts_per_token
    kv_width = 2 * arch.n_kv_heads * arch.head_dim
    if arch.uses_mla:
        kv_width = (arch.kv_lora_rank or 0) + (arch.qk_rope_head_dim or 0)
    non_embed = max(total - embed, 1)
    return _ArchNumbers(
        n_layers=arch.n_layers,
        hidden=arch.hidden_size,
        n_heads=arch.n_heads,
        attn_dim=arch.n_heads * arch.head_dim,
        kv_dim=arch.kv_elems_per_token_per_layer(),
        kv_width=kv_width,
        ffn=ffn,
        gated=1.0 if arch.gated_mlp else 0.0,
        vocab=arch.vocab_size,
        total_params=total,
        embed_params=embed,
        input_embed_params=input_embed,
        active_params=active,
        flop_params=flop_params,
        expert_params=arch.expert_params(),
        n_experts=arch.n_experts,
        n_active_experts=arch.n_active_experts,
        layer_params=non_embed / arch.n_layers,
        is_moe=1.0 if arch.is_moe else 0.0,
        encoder_only=1.0 if arch.encoder_only else 0.0,
    )


@dataclass(frozen=True, slots=True)
class JobArrays:
    """One entry per job; all float64 arrays of shape ``(n_jobs,)``."""

    # architecture
    n_layers: np.ndarray
    hidden: np.ndarray
    n_heads: np.ndarray
    attn_dim: np.ndarray
    kv_dim: np.ndarray
    kv_width: np.ndarray
    ffn: np.ndarray
    gated: np.ndarray
    vocab: np.ndarray
    total_params: np.ndarray
    embed_params: np.ndarray
    input_embed_params: np.ndarray
    active_params: np.ndarray
    flop_params: np.ndarray
    expert_params: np.ndarray
    n_experts: np.ndarray
    n_active_experts: np.ndarray
    layer_params: np.ndarray
    is_moe: np.ndarray
    encoder_only: np.ndarray
    # job
    task: np.ndarray  # index into TASKS
    framework: np.ndarray  # index into FRAMEWORKS (hf when unset)
    optimizer: np.ndarray  # index into OPTIMIZERS (none for inference)
    weight_bytes: np.ndarray
    weight_is_quantised: np.ndarray
    compute_bytes: np.ndarray
    compute_dtype: np.ndarray  # index into DTYPES
    kv_bytes: np.ndarray
    batch: np.ndarray
    grad_accum: np.ndarray
    seq_len: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    num_requests: np.ndarray
    steps: np.ndarray
    checkpointing: np.ndarray
    lora_params: np.ndarray
    n_gpus: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero_stage: np.ndarray
    # memory fidelity
    adapter_bytes: np.ndarray  # bytes per LoRA adapter element (fp32 in PEFT by default)
    compiled: np.ndarray
    chunked_loss: np.ndarray
    act_offload: np.ndarray
    lora_in_width: np.ndarray  # summed input widths of the adapted linears, per layer and token
    lora_new_width: np.ndarray  # of those, inputs a frozen layer would not have saved anyway
    lora_dropout: np.ndarray  # 1 when the adapters drop their inputs (p > 0)
    eager_attn: np.ndarray  # 1 when the job asks for HF's eager attention
    grads_kept: np.ndarray  # 1 when `zero_grad` zeroes the gradients instead of freeing them
    classify: np.ndarray  # 1 for a sequence-classification head (no vocabulary logits)
    softmax_keeps_input: np.ndarray  # 1 when the job's torch (< 1.11) saves softmax's input
    kv_len: np.ndarray  # tokens the KV cache holds at its peak (preallocated or input + output)
    kv_heads_scale: np.ndarray  # cached heads over KV heads (query heads / KV heads if expanded)
    shifted_logits: np.ndarray  # 1 when the loss copies the shifted fp32 logits (< 4.50)
    train_kv: np.ndarray  # 1 when the training forward keeps every layer's K/V (`use_cache`)

    def __len__(self) -> int:
        return len(self.n_layers)


_ATTN_IN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj"})
_ATTN_IN |= {"kv_a_proj", "kv_b_proj"}
_QV_IN = frozenset({"q_proj", "v_proj", "q_b_proj", "kv_b_proj"})


@lru_cache(maxsize=4096)
def _lora_widths(arch: ModelArch, target: str) -> tuple[float, float]:
    """Per layer and token: the summed inputs of the adapted linears (each adapter keeps its
    own copy when PEFT casts it), and the inputs no frozen layer would save otherwise (the
    MLP input when gate/up are adapted, ``act(gate)·up`` when down is)."""
    total = 0.0
    new = 0.0
    mlp_in = down_in = False
    for name, i, _o, count in arch.linear_layers(active_only=True):
        base = name.removeprefix("expert_").removeprefix("shared_")
        if name in ("lm_head", "router"):
            continue
        if target == "attention" and base not in _ATTN_IN:
            continue
        if target == "qv" and base not in _QV_IN:
            continue
        total += i * count / arch.n_layers
        if base in ("gate_proj", "up_proj", "fc1", "fc_in"):
            mlp_in = True
        if base in ("down_proj", "fc2", "fc_out"):
            down_in = True
    if mlp_in:
        new += arch.hidden_size
    if down_in:
        new += arch.intermediate_size if not arch.is_moe else arch.expert_intermediate_size
    return total, new


def _job_row(spec: JobSpec) -> tuple[float, ...]:
    a = _arch_numbers(spec.arch)
    task = spec.task
    weight = spec.weight_dtype or DType.BF16
    compute = spec.compute_dtype or DType.BF16
    kv = spec.kv_cache_dtype or compute
    lora = 0.0
    if task.is_peft and spec.lora_rank and spec.lora_target:
        lora = float(spec.arch.lora_params(spec.lora_rank, spec.lora_target.value))
    framework = spec.framework or Framework.HF
    optimizer = spec.optimizer or Optimizer.NONE
    lora_in, lora_new = (
        _lora_widths(spec.arch, spec.lora_target.value)
        if task.is_peft and spec.lora_target
        else (0.0, 0.0)
    )
    adapter = spec.adapter_dtype or DType.FP32
    return (
        a.n_layers,
        a.hidden,
        a.n_heads,
        a.attn_dim,
        a.kv_dim,
        a.kv_width,
        a.ffn,
        a.gated,
        a.vocab,
        a.total_params,
        a.embed_params,
        a.input_embed_params,
        a.active_params,
        a.flop_params,
        a.expert_params,
        a.n_experts,
        a.n_active_experts,
        a.layer_params,
        a.is_moe,
        a.encoder_only,
        # A `serve` replica is predicted as inference at `batch_size` concurrent sequences.
        TASKS.index(Task.INFERENCE if task is Task.SERVE else task),
        FRAMEWORKS.index(framework),
        OPTIMIZERS.index(optimizer),
        weight_qbytes(spec),
        1.0 if weight in (DType.FP8, DType.INT8, DType.INT4, DType.NF4, DType.FP4) else 0.0,
        _QBYTES[compute] if compute in (DType.FP32, DType.BF16, DType.FP16) else 2.0,
        DTYPES.index(compute),
        _QBYTES[kv] if kv in (DType.FP32, DType.BF16, DType.FP16, DType.FP8, DType.INT8) else 1.0,
        spec.batch_size,
        spec.gradient_accumulation or 1,
        spec.seq_len or 0,
        spec.input_len or 0,
        spec.output_len or 0,
        spec.num_requests or (spec.batch_size if task is Task.SERVE else 0),
        spec.steps or 0,
        1.0 if spec.gradient_checkpointing else 0.0,
        lora,
        spec.n_gpus,
        spec.tensor_parallel,
        spec.pipeline_parallel,
        spec.data_parallel,
        spec.zero_stage or 0,
        _QBYTES[adapter] if adapter in (DType.FP32, DType.BF16, DType.FP16) else 2.0,
        1.0 if spec.compile else 0.0,
        1.0 if spec.chunked_loss else 0.0,
        1.0 if spec.activation_offload else 0.0,
        lora_in,
        lora_new,
        1.0 if task.is_peft and spec.lora_dropout else 0.0,
        1.0 if spec.attn_implementation is AttnImplementation.EAGER else 0.0,
        1.0 if task.is_training and spec.zero_grad_set_to_none is False else 0.0,
        1.0 if spec.head is Head.CLASSIFICATION else 0.0,
        1.0 if task.is_training and saves_softmax_input(spec) else 0.0,
        float(spec.kv_cache_max_len or (spec.input_len or 0) + (spec.output_len or 0)),
        _kv_heads_scale(spec),
        1.0 if task.is_training and shifts_fp32_logits(spec) else 0.0,
        1.0 if task.is_training and spec.use_cache else 0.0,
    )


def _kv_heads_scale(spec: JobSpec) -> float:
    """Heads the cache stores per KV head: the query heads' share when K/V are expanded before
    caching (``kv_cache_query_heads``), else 1."""
    arch = spec.arch
    if not spec.kv_cache_query_heads or not arch.n_kv_heads or arch.kv_lora_rank is not None:
        return 1.0
    return arch.n_heads / arch.n_kv_heads


_FIELDS = tuple(f.name for f in fields(JobArrays))


#: The last batch's arrays, with the specs they came from: one ``predict`` builds them for the
#: analytical table and again for each learned correction's features, for the same specs.
_last: tuple[tuple[int, ...], list[JobSpec], JobArrays] | None = None


def job_arrays(specs: Sequence[JobSpec]) -> JobArrays:
    """The specs' numeric fields as arrays, one row per spec (read-only; the same object for
    the same spec objects in a row: specs are frozen, and the held list keeps their ids)."""
    global _last
    key = tuple(map(id, specs))
    if _last is not None and _last[0] == key:
        return _last[2]
    rows = np.array([_job_row(s) for s in specs], dtype=np.float64).reshape(len(specs), -1)
    rows.flags.writeable = False
    out = JobArrays(**{name: rows[:, k] for k, name in enumerate(_FIELDS)})
    _last = (key, list(specs), out)
    return out
