"""Analytical runtime: a roofline with per-GPU efficiency factors, vectorised over jobs × GPUs.

* Training: FLOPs = 6·N·tokens (8·N with recompute, 4·N for LoRA/QLoRA, N = active matmul
  params incl. the lm head) plus causal attention, divided by peak × MFU. MFU falls for small
  models and small micro-batches. TP all-reduces, the DP gradient all-reduce (mostly hidden
  behind backward) and the pipeline bubble are charged on top.
* Prefill (TTFT) is compute-bound: 2·N·tokens + attention over peak × prefill efficiency, but
  never faster than reading the weights once.
* Decode (TPOT) is memory-bound: (weights read + KV read) / (HBM bandwidth × MBU), plus a
  per-layer launch cost that dominates eager HF decoding and CUDA graphs remove.

Every efficiency constant sits in :class:`RuntimeModel`; the learned tier corrects them from
measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._jobarrays import DTYPES, FRAMEWORKS, TASKS, JobArrays
from .gpus import GpuType
from .spec import DType, Framework, Task

__all__ = ["RuntimeModel", "runtime_figures"]

_IDX_T = {t: TASKS.index(t) for t in Task}
_IDX_F = {f: FRAMEWORKS.index(f) for f in Framework}
_IDX_D = {d: DTYPES.index(d) for d in DType}


@dataclass(frozen=True, slots=True)
class RuntimeModel:
    # Best-case training MFU for a large dense model in bf16, per GPU type. Anchors:
    # dgxc-benchmarking Llama 3.1 70B BF16 on H100 reports MFU 54.1%; llm-foundry MPT tables
    # reach ~0.6 on A100. B200 kernels are less mature (Megatron-Bridge ~0.35 of FP8 peak).
    train_mfu_bf16: tuple[tuple[str, float], ...] = (
        ("A100-40GB", 0.62),
        ("A100-80GB", 0.62),
        ("H100-80GB", 0.55),
        ("H200-141GB", 0.57),
        ("B200-180GB", 0.48),
    )
    train_mfu_default: float = 0.45
    low_precision_mfu_scale: float = 0.67  # dgxc 70B: FP8 MFU 36.2% of FP8 peak vs BF16 54.1%
    size_knee_hidden: float = 400.0  # efficiency ∝ h/(h+knee): small models launch-bound
    tokens_knee: float = 256.0  # efficiency ∝ tok/(tok+knee) per micro-batch per GPU
    eager_framework_scale: float = 0.8  # HF/PEFT/other without compile or fused kernels
    qlora_dequant_scale: float = 0.65  # 4-bit dequantisation in every matmul
    prefill_mfu: float = 0.5
    prefill_tokens_knee: float = 64.0
    decode_compute_mfu: float = 0.4  # large-batch decode turns compute-bound
    decode_mbu_engine: float = 0.75  # vLLM/TRT-LLM/SGLang
    decode_mbu_eager: float = 0.55  # HF / PEFT generate
    decode_mbu_other: float = 0.6  # unknown stacks: between the two
    launch_s_per_layer_eager: float = 3.0e-4  # HF eager decode: Python + kernel launches
    launch_s_per_layer_other: float = 1.0e-4
    launch_s_per_layer_engine: float = 2.0e-5  # CUDA graphs
    allreduce_latency_s: float = 1.5e-5
    inter_node_bandwidth_gbps: float = 50.0  # 400 Gb/s InfiniBand per GPU
    dp_comm_exposed: float = 0.3  # share of the gradient all-reduce not hidden by backward
    attention_flops_factor: float = 6.0
    moe_mfu_scale: float = 0.6  # routing, all-to-all and small per-expert GEMMs
    tp_comm_exposed: float = 0.5  # Megatron overlaps part of the TP collectives with GEMMs

    def mfu(self, gpu: str) -> float:
        return dict(self.train_mfu_bf16).get(gpu, self.train_mfu_default)


def _peak_flops(gpus: Sequence[GpuType], compute_dtype: np.ndarray) -> np.ndarray:
    """(n_jobs, n_gpus) dense peak FLOP/s for each job's compute dtype on each GPU."""
    table = np.array(
        [[g.peak_tflops_for(d.value) * 1e12 for g in gpus] for d in DTYPES], dtype=np.float64
    )
    return table[compute_dtype.astype(np.int64)]


def runtime_figures(
    j: JobArrays,
    gpus: Sequence[GpuType],
    weights_bytes_per_gpu: np.ndarray,
    rm: RuntimeModel | None = None,
) -> dict[str, np.ndarray]:
    """``runtime_s``, ``step_time_s``, ``ttft_s``, ``tpot_s`` and ``busy_frac`` as
    ``(n_jobs, n_gpus)`` arrays.

    ``weights_bytes_per_gpu`` is the weights term of the memory model (what decode reads).
    NaN marks a figure that does not apply to the task.
    """
    rm = rm or RuntimeModel()
    # Training and inference formulas are evaluated for every job and masked at the end, so
    # the branch that does not apply divides by zero-length sequences; silence those NaNs.
    with np.errstate(divide="ignore", invalid="ignore"):
        return _runtime_figures(j, gpus, weights_bytes_per_gpu, rm)


def _runtime_figures(
    j: JobArrays, gpus: Sequence[GpuType], weights_bytes_per_gpu: np.ndarray, rm: RuntimeModel
) -> dict[str, np.ndarray]:
    col = lambda v: v[:, None]  # noqa: E731
    peak = _peak_flops(gpus, j.compute_dtype)
    bw = np.array([g.hbm_bandwidth_gbps * 1e9 for g in gpus])[None, :]
    link = np.array([g.nvlink_bandwidth_gbps * 1e9 / 2 for g in gpus])[None, :]  # one direction
    mfu_gpu = np.array([rm.mfu(g.name) for g in gpus])[None, :]

    fw = j.framework
    is_infer = j.task == _IDX_T[Task.INFERENCE]
    is_peft = np.isin(j.task, [_IDX_T[Task.LORA], _IDX_T[Task.QLORA]])
    is_qlora = j.task == _IDX_T[Task.QLORA]
    engine = np.isin(
        fw, [_IDX_F[Framework.VLLM], _IDX_F[Framework.TRTLLM], _IDX_F[Framework.SGLANG]]
    )
    eager = np.isin(fw, [_IDX_F[Framework.HF], _IDX_F[Framework.PEFT], _IDX_F[Framework.OTHER]])
    hf_like = np.isin(fw, [_IDX_F[Framework.HF], _IDX_F[Framework.PEFT]])
    low_prec = np.isin(j.compute_dtype, [_IDX_D[DType.FP8], _IDX_D[DType.FP4]])
    tp, pp, dp = j.tp, j.pp, j.dp
    a = j.compute_bytes
    size_eff = j.hidden / (j.hidden + rm.size_knee_hidden)

    # ---- training ----
    tokens_mb = j.batch * j.seq_len
    flops_per_token = (
        np.where(is_peft, 4.0, np.where(j.checkpointing > 0, 8.0, 6.0)) * j.flop_params
    )
    # Attention: 12·L·s·d per token (fwd+bwd) for full attention, halved by causal masking.
    # (Counting the full square fits the 32k–65k llm-foundry rows better but every shorter
    # row worse: step-time MAPE 25% vs 22% on the published data.)
    flops_per_token = (
        flops_per_token
        + rm.attention_flops_factor
        * (1.0 + j.checkpointing / 3.0)
        * j.n_layers
        * j.seq_len
        * j.attn_dim
    )
    step_flops_per_gpu = flops_per_token * tokens_mb * j.grad_accum * dp / j.n_gpus
    tok_eff = (tokens_mb / tp) / (tokens_mb / tp + rm.tokens_knee)
    eff = (
        mfu_gpu
        * col(size_eff * tok_eff)
        * col(np.where(eager, rm.eager_framework_scale, 1.0))
        * col(np.where(is_qlora, rm.qlora_dequant_scale, 1.0))
        * col(np.where(low_prec, rm.low_precision_mfu_scale, 1.0))
        * col(np.where(j.is_moe > 0, rm.moe_mfu_scale, 1.0))
    )
    compute_s = col(step_flops_per_gpu) / (peak * eff)
    tp_msgs = np.where(tp > 1, (4.0 + 2.0 * j.checkpointing) * j.n_layers / pp * j.grad_accum, 0.0)
    tp_bytes = tokens_mb * j.hidden * a
    tp_s = (
        rm.tp_comm_exposed
        * col(tp_msgs)
        * (rm.allreduce_latency_s + col(2.0 * (tp - 1) / np.maximum(tp, 1) * tp_bytes) / link)
    )
    dp_link = np.where(col(j.n_gpus) > 8, rm.inter_node_bandwidth_gbps * 1e9, link)
    trainable = np.where(is_peft, j.lora_params, j.total_params) / (tp * pp)
    zero3 = np.where(j.zero_stage >= 3, 1.5, 1.0)
    dp_bytes = np.where(dp > 1, 2.0 * (dp - 1) / dp * trainable * 2.0 * zero3, 0.0)
    dp_s = rm.dp_comm_exposed * col(dp_bytes) / dp_link
    bubble = col(1.0 + (pp - 1) / np.maximum(j.grad_accum, 1.0))
    step_s = (compute_s + tp_s) * bubble + dp_s

    # ---- inference ----
    prefill_tokens = j.batch * j.input_len
    prefill_flops = (
        2.0 * j.flop_params * prefill_tokens
        + 2.0 * j.n_layers * j.batch * (j.input_len**2) * j.attn_dim
    )
    prefill_eff = (
        rm.prefill_mfu
        * col(size_eff * prefill_tokens / (prefill_tokens + rm.prefill_tokens_knee))
        * col(np.where(low_prec, rm.low_precision_mfu_scale, 1.0))
    )
    weight_read_s = col(weights_bytes_per_gpu) / (bw * rm.decode_mbu_engine)
    ttft = np.maximum(col(prefill_flops / (tp * pp)) / (peak * prefill_eff), weight_read_s)
    ttft = ttft + col(np.where(tp > 1, 2.0 * j.n_layers, 0.0)) * (
        rm.allreduce_latency_s + col(prefill_tokens * j.hidden * a) / link
    )

    # MoE decode reads only the experts the batch touches: E·(1 − (1 − k/E)^b) of them.
    expert_frac = np.where(
        j.is_moe > 0,
        1.0 - (1.0 - j.n_active_experts / np.maximum(j.n_experts, 1.0)) ** j.batch,
        1.0,
    )
    expert_bytes = j.expert_params * j.weight_bytes / (tp * pp)
    decode_weight_bytes = weights_bytes_per_gpu - expert_bytes * (1.0 - expert_frac)
    mean_ctx = j.input_len + j.output_len / 2.0
    kv_read = j.n_layers / pp * j.kv_dim / tp * j.kv_bytes * j.batch * mean_ctx
    mbu = np.select(
        [engine, hf_like], [rm.decode_mbu_engine, rm.decode_mbu_eager], rm.decode_mbu_other
    )
    mem_s = col(decode_weight_bytes + kv_read) / (bw * col(mbu))
    dec_compute_s = col(2.0 * j.flop_params * j.batch / (tp * pp)) / (
        peak * rm.decode_compute_mfu * col(np.where(low_prec, rm.low_precision_mfu_scale, 1.0))
    )
    launch = np.select(
        [engine, hf_like],
        [rm.launch_s_per_layer_engine, rm.launch_s_per_layer_eager],
        rm.launch_s_per_layer_other,
    )
    tpot = np.maximum(mem_s, dec_compute_s) + col(launch * j.n_layers)
    tpot = tpot + col(np.where(tp > 1, 2.0 * j.n_layers, 0.0)) * rm.allreduce_latency_s

    replicas = np.maximum(dp, 1.0)
    batches = np.ceil(j.num_requests / (j.batch * replicas))
    infer_runtime = col(batches) * (ttft + col(j.output_len) * tpot)

    # Busy fraction: the share of the runtime during which the GPU's bottleneck resource
    # (tensor cores or HBM) is saturated. Only that share stretches on a smaller MIG slice;
    # launch overhead and small-kernel idle time do not. Training: the size and micro-batch
    # efficiency losses are idle time. Inference: prefill's token-count losses and decode's
    # per-layer launch cost are idle time.
    train_busy = col(size_eff * tok_eff) * np.ones_like(step_s)
    prefill_busy = ttft * col(size_eff * prefill_tokens / (prefill_tokens + rm.prefill_tokens_knee))
    decode_busy = np.maximum(mem_s, dec_compute_s)
    infer_busy = col(batches) * (prefill_busy + col(j.output_len) * decode_busy)
    busy_frac = np.clip(
        np.where(col(is_infer), infer_busy / np.maximum(infer_runtime, 1e-12), train_busy), 0.0, 1.0
    )

    nan = np.full_like(step_s, np.nan)
    inf_mask = col(is_infer)
    return {
        "busy_frac": busy_frac,
        "runtime_s": np.where(inf_mask, infer_runtime, step_s * col(j.steps)),
        "step_time_s": np.where(inf_mask, nan, step_s),
        "ttft_s": np.where(inf_mask, ttft, nan),
        "tpot_s": np.where(inf_mask, tpot, nan),
    }
