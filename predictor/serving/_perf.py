"""Serving performance maths: the one place the planner gets times, bytes and efficiencies from.

Everything the planner knows about speed goes through :class:`ReplicaPerf` (built by
:func:`replica_perf`) and :func:`dtype_support`, so that the runtime model of issue 14
(``predictor/_runtime.py`` and ``predictor/efficiency.py``) can later replace the constants in
:class:`PerfConstants` without touching the queueing or planning code.

The model is a roofline of one continuous-batching *iteration* (vLLM/SGLang/TRT-LLM all run one
fused forward pass per step over the running decode sequences plus a chunk of new prompts):

* bytes: the weights the step touches (for MoE, only the experts its tokens route to:
  ``E·(1 − (1 − k/E)^tokens)``) plus the KV cache the decode sequences read;
* FLOPs: ``2·N_active`` per token plus causal attention;
* time = max(bytes / (HBM BW × MBU), FLOPs / (peak × MFU)) + TP all-reduces + a fixed per-step
  engine cost (scheduler, sampler, launch; CUDA graphs keep it small).

Constants and where they come from (``RuntimeModel`` = ``predictor/_runtime.py`` at the
commit this module was written against; ``MemoryModel`` = ``predictor/_memory.py``):

* FITTED by ``benchmarks/fit_serving.py`` (six global constants, one fit for every GPU and
  model): ``decode_mbu``, ``gemm_mfu``, ``fp8_mfu_scale``, ``fp4_mfu_scale``,
  ``step_overhead_s`` and ``step_overhead_per_seq_s``, on the TensorRT-LLM perf-overview v1.0
  max-load rows *other than* the Llama-3.3-70B 1000/1000 cells, plus three NIM inter-token
  latencies. Every figure checked in ``tests/predictor/serving`` is held out except where
  those tests say otherwise. Starting points were ``RuntimeModel.decode_mbu_engine`` 0.75,
  ``prefill_mfu`` 0.5 and ``low_precision_mfu_scale`` 0.67.
* ``decode_mbu_hf`` 0.55: ``RuntimeModel.decode_mbu_eager``.
* ``moe_mfu_scale`` 0.6, ``allreduce_latency_s`` 15 µs, ``launch_s_per_layer`` 20 µs:
  ``RuntimeModel.moe_mfu_scale``, ``allreduce_latency_s``, ``launch_s_per_layer_engine``.
* ``engine_mbu_scale``: per-framework decode efficiency relative to TensorRT-LLM, 1.0 for all
  engines (no public same-hardware comparison in ``../shared/validation`` pins a difference).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..gpus import GpuType, MigProfile
from ..models import ModelArch
from ..spec import DType, Framework

__all__ = [
    "PERF",
    "PerfConstants",
    "ReplicaPerf",
    "Slot",
    "dtype_support",
    "kv_bytes_per_token",
    "replica_perf",
    "weight_bytes_per_gpu",
]

GB = 1e9

#: Bytes per stored weight element including quantisation scales (mirrors
#: ``predictor._jobarrays._QBYTES``: GPTQ/AWQ group-128 int4, NVFP4 with an fp8 scale per 16).
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
_KV_DTYPES = (DType.BF16, DType.FP16, DType.FP8)


@dataclass(frozen=True, slots=True)
class PerfConstants:
    # Fitted by benchmarks/fit_serving.py (results/serving_fit.json); see the module docstring.
    decode_mbu: float = 0.55
    gemm_mfu: float = 0.65
    fp8_mfu_scale: float = 0.7
    fp4_mfu_scale: float = 0.4
    step_overhead_s: float = 5.0e-4
    step_overhead_per_seq_s: float = 5.0e-6  # scheduler + sampler work per running sequence
    # Not fitted: quoted from RuntimeModel (predictor/_runtime.py) defaults.
    decode_mbu_hf: float = 0.55
    tokens_knee: float = 64.0  # GEMM efficiency ∝ T/(T + knee) for T tokens in the step
    moe_mfu_scale: float = 0.6
    allreduce_latency_s: float = 1.5e-5
    launch_s_per_layer: float = 2.0e-5
    launch_s_per_layer_hf: float = 3.0e-4
    engine_mbu_scale: tuple[tuple[str, float], ...] = (
        ("trtllm", 1.0),
        ("vllm", 1.0),
        ("sglang", 1.0),
        ("hf", 1.0),
    )

    def mbu(self, framework: Framework) -> float:
        base = self.decode_mbu_hf if framework is Framework.HF else self.decode_mbu
        return base * dict(self.engine_mbu_scale).get(framework.value, 1.0)


PERF = PerfConstants()


@dataclass(frozen=True, slots=True)
class Slot:
    """What one GPU of a replica offers: a whole GPU or a MIG slice of one."""

    gpu: GpuType
    mig: MigProfile | None = None

    @property
    def name(self) -> str:
        return self.gpu.name if self.mig is None else f"{self.gpu.name}:{self.mig.name}"

    @property
    def memory_gib(self) -> float:
        return self.gpu.memory_gib if self.mig is None else self.mig.memory_gib

    @property
    def compute_share(self) -> float:
        return 1.0 if self.mig is None else self.mig.compute_slices / 7.0

    @property
    def bandwidth_share(self) -> float:
        # MIG splits the memory controllers with the memory slices (eighths of the GPU).
        return 1.0 if self.mig is None else self.mig.memory_slices / 8.0

    @property
    def price_usd_per_hour(self) -> float:
        # Billed by compute share, as scheduler/pool.py prices MIG slices.
        return self.gpu.price_usd_per_hour * self.compute_share


def dtype_support(gpu: GpuType, dtype: DType, framework: Framework, *, kv: bool = False) -> str:
    """Empty string when ``dtype`` can serve on ``gpu`` with ``framework``, else the reason."""
    if kv:
        if dtype not in _KV_DTYPES:
            return f"KV cache dtype {dtype.value} is not offered by serving engines; use bf16/fp8"
        return ""
    if dtype is DType.FP4 and "fp4" not in gpu.peak_tflops:
        return f"fp4 weights need Blackwell FP4 tensor cores; {gpu.name} has none"
    if dtype is DType.FP8 and "fp8" not in gpu.peak_tflops and framework is Framework.TRTLLM:
        return f"TensorRT-LLM has no FP8 path on {gpu.name} (no FP8 tensor cores)"
    if dtype is DType.NF4 and framework is not Framework.VLLM and framework is not Framework.HF:
        return f"{framework.value} does not load bitsandbytes nf4 checkpoints"
    return ""


def _compute_dtype(gpu: GpuType, weight: DType) -> str:
    """The tensor-core path the GEMMs take: fp8/fp4 where the GPU has it, else bf16."""
    if weight is DType.FP4 and "fp4" in gpu.peak_tflops:
        return "fp4"
    if weight in (DType.FP8, DType.FP4) and "fp8" in gpu.peak_tflops:
        return "fp8"
    return "fp32" if weight is DType.FP32 else "bf16"


def weight_bytes_per_gpu(arch: ModelArch, weight: DType, tp: int) -> float:
    """Stored weight bytes per GPU; quantised formats keep embeddings and the head in bf16."""
    embed = arch.embedding_params()
    body = arch.total_params() - embed
    quantised = weight not in (DType.FP32, DType.BF16, DType.FP16)
    return (body * _QBYTES[weight] + embed * (2.0 if quantised else _QBYTES[weight])) / tp


def kv_bytes_per_token(arch: ModelArch, kv: DType, tp: int) -> float:
    """KV-cache bytes one token adds on each GPU of a TP group.

    GQA heads split across TP ranks until there are fewer heads than ranks, then replicate;
    an MLA latent is replicated on every rank (vLLM's layout).
    """
    if arch.uses_mla:
        return float(arch.kv_elems_per_token()) * _QBYTES[kv]
    heads_per_rank = max(1.0, arch.n_kv_heads / tp)
    return arch.n_layers * 2.0 * heads_per_rank * arch.head_dim * _QBYTES[kv]


@dataclass(frozen=True, slots=True)
class ReplicaPerf:
    """Per-GPU costs of one replica (``tp`` GPUs of ``slot``), with :meth:`iteration_s`."""

    slot: Slot
    tp: int
    weight: DType
    kv: DType
    framework: Framework
    weight_bytes: float  # stored, per GPU
    dense_bytes: float  # weights every step reads (non-expert + shared experts), per GPU
    expert_bytes: float  # all routed experts, per GPU
    experts: int
    active_experts: int
    kv_bytes_token: float
    flops_per_token: float  # 2 · active matmul params, whole model
    attn_flops_per_ctx_token: float  # per query token per context token, whole model
    peak_flops: float  # per GPU, for the GEMM dtype, after MIG share
    bandwidth: float  # bytes/s per GPU, after MIG share
    link_bytes_s: float
    n_layers: int
    hidden: int
    constants: PerfConstants = field(default=PERF)

    def iteration_s(self, decode_seqs: float, mean_ctx: float, prefill_tokens: float) -> float:
        """Wall time of one engine step: ``decode_seqs`` decoding at ``mean_ctx`` context, plus
        ``prefill_tokens`` prompt tokens (each attending to about half the prompt so far)."""
        c = self.constants
        tokens = decode_seqs + prefill_tokens
        if self.experts > 1:
            touched = 1.0 - (1.0 - self.active_experts / self.experts) ** max(tokens, 1.0)
        else:
            touched = 1.0
        read = self.dense_bytes + self.expert_bytes * touched
        read += decode_seqs * mean_ctx * self.kv_bytes_token
        mem_s = read / (self.bandwidth * c.mbu(self.framework))
        flops = self.flops_per_token * tokens + self.attn_flops_per_ctx_token * (
            decode_seqs * mean_ctx + prefill_tokens * mean_ctx / 2.0
        )
        eff = c.gemm_mfu * tokens / (tokens + c.tokens_knee) if tokens > 0 else c.gemm_mfu
        eff *= {"fp8": c.fp8_mfu_scale, "fp4": c.fp4_mfu_scale}.get(self._gemm_dtype, 1.0)
        if self.experts > 1:
            eff *= c.moe_mfu_scale
        compute_s = flops / self.tp / (self.peak_flops * eff)
        launch = (
            c.launch_s_per_layer_hf if self.framework is Framework.HF else c.launch_s_per_layer
        ) * self.n_layers
        comm = 0.0
        if self.tp > 1:
            msg = tokens * self.hidden * 2.0 * 2.0 * (self.tp - 1) / self.tp
            comm = 2.0 * self.n_layers * (c.allreduce_latency_s + msg / self.link_bytes_s)
        overhead = c.step_overhead_s + c.step_overhead_per_seq_s * decode_seqs
        return max(mem_s, compute_s) + comm + launch + overhead

    def prefill_s(self, prompt_tokens: float) -> float:
        """One prompt prefilled alone (the TTFT floor at zero load)."""
        return self.iteration_s(0.0, prompt_tokens, prompt_tokens)

    def roofline_share(self, decode_seqs: float, mean_ctx: float, prefill_tokens: float) -> float:
        """Achieved share of the bottleneck's peak (HBM bandwidth or FLOP/s) during a step,
        the utilisation of the power model (0..1)."""
        step = self.iteration_s(decode_seqs, mean_ctx, prefill_tokens)
        read = self.weight_bytes + decode_seqs * mean_ctx * self.kv_bytes_token
        mem = read / self.bandwidth
        flops = self.flops_per_token * (decode_seqs + prefill_tokens) / self.tp
        return min(1.0, max(mem, flops / self.peak_flops) / step)

    @property
    def _gemm_dtype(self) -> str:
        return _compute_dtype(self.slot.gpu, self.weight)


def replica_perf(
    arch: ModelArch,
    slot: Slot,
    tp: int,
    weight: DType,
    kv: DType,
    framework: Framework,
    constants: PerfConstants = PERF,
) -> ReplicaPerf:
    """Precompute the per-GPU byte and FLOP costs of one replica."""
    wbytes = weight_bytes_per_gpu(arch, weight, tp)
    routed = arch.n_moe_layers * arch.n_experts * arch.expert_params()
    embed = arch.embedding_params()
    quantised = weight not in (DType.FP32, DType.BF16, DType.FP16)
    expert_bytes = routed * _QBYTES[weight] / tp
    # The input embedding is a lookup: a step reads a few rows, not the table.
    lookup = arch.vocab_size * arch.hidden_size * (2.0 if quantised else _QBYTES[weight]) / tp
    if arch.tie_embeddings:
        lookup = 0.0
    dense_bytes = wbytes - expert_bytes - lookup
    flop_params = arch.active_params(include_input_embedding=False)
    if arch.tie_embeddings:
        flop_params += arch.vocab_size * arch.hidden_size
    attn_dim = arch.n_heads * (
        (arch.qk_nope_head_dim or 0) + (arch.qk_rope_head_dim or 0)
        if arch.uses_mla
        else arch.head_dim
    )
    gemm = _compute_dtype(slot.gpu, weight)
    del embed
    return ReplicaPerf(
        slot=slot,
        tp=tp,
        weight=weight,
        kv=kv,
        framework=framework,
        weight_bytes=wbytes,
        dense_bytes=dense_bytes,
        expert_bytes=expert_bytes,
        experts=arch.n_experts if arch.is_moe else 1,
        active_experts=arch.n_active_experts if arch.is_moe else 1,
        kv_bytes_token=kv_bytes_per_token(arch, kv, tp),
        flops_per_token=2.0 * flop_params,
        attn_flops_per_ctx_token=4.0 * arch.n_layers * attn_dim,
        peak_flops=slot.gpu.peak_tflops_for(gemm) * 1e12 * slot.compute_share,
        bandwidth=slot.gpu.hbm_bandwidth_gbps * GB * slot.bandwidth_share,
        link_bytes_s=slot.gpu.nvlink_bandwidth_gbps * GB / 2.0,
        n_layers=arch.n_layers,
        hidden=arch.hidden_size,
        constants=constants,
    )
