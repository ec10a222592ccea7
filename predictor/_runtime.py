"""Analytical runtime: an operator-class roofline, vectorised over jobs × GPUs.

Every job is split into classes of work, each timed against its own ceiling with its own
efficiency from :mod:`predictor.efficiency`:

* **GEMMs**: ``2·N`` FLOPs per token forward, ``6·N`` forward+backward, ``4·N`` for LoRA (no
  weight gradients); activation recompute adds the forward it repeats (``+2·N``). Efficiency
  per architecture and dtype, falling for small matrices (``hidden / TP``) and for few tokens
  per GEMM, with the token knee at the GPU's ridge point (peak FLOP/s over HBM bytes/s: below
  it a GEMM is bound by reading its weights). Around the ridge the GEMM's time is the p-norm
  of its compute time and its weight-read time (:func:`roofline_share`, ``gemm.roofline_p``):
  not their sum, which charged a prompt near the ridge for both in full. A routed expert's
  GEMMs see only ``tokens·k/E`` of the tokens (balanced routing), so fine-grained MoE layers
  sit lower on that knee.
* **Attention**: causal ``2·L·s·d`` FLOPs per token forward, 2.5× that backward, at the
  attention kernel's own efficiency (FlashAttention-2, or FA3 / cuDNN on Hopper and Blackwell
  under Megatron and the serving engines), falling for short sequences.
* **Elementwise** (norms, activations, residuals): bytes over HBM bandwidth.
* **Fixed costs**: a per-layer launch floor, and the serving engine's per-step and per-request
  CPU work (scheduling, sampling, detokenisation), which does not speed up on a faster GPU.
  The launch floors and the eager per-collective syncs below are latency-bound: their priors
  are A100 figures and they scale with ``1 / boost clock`` (:func:`latency_scale`).
* **Collectives**: ring all-reduce, ``2(p−1)`` hop latencies plus ``2(p−1)/p`` of the bytes
  over the achieved link bandwidth (NVLink 3/4/5 by GPU, PCIe without NVLink, InfiniBand
  between nodes). Stacks without CUDA graphs (HF, research stacks) also pay a host barrier per
  collective that grows with ``log2(TP)``: each rank issues its kernels from its own process
  and the all-reduce waits for the slowest. MoE training sends every token's ``k`` routed
  copies to the experts' GPUs and back (dispatch and combine all-to-alls over the data-parallel
  ranks of a node); the permutation into expert order is elementwise HBM traffic.

Prefill (TTFT) is compute-bound but never faster than reading the weights once; a decode step
(TPOT) is the larger of reading weights + KV cache at the achieved bandwidth (MBU) and the
batch's GEMMs, plus its fixed costs. :func:`prefill_s` and :func:`decode_step_s` take one batch
and length per job; :mod:`predictor.engine` exposes them for one model at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ._jobarrays import DTYPES, FRAMEWORKS, TASKS, JobArrays
from .efficiency import Efficiencies, default_efficiencies, gpu_architecture
from .gpus import GpuType
from .spec import DType, Framework, Task

__all__ = [
    "BOOST_CLOCK_MHZ",
    "RuntimeModel",
    "decode_step_s",
    "latency_scale",
    "prefill_s",
    "roofline_share",
    "runtime_figures",
]

_IDX_T = {t: TASKS.index(t) for t in Task}
_IDX_F = {f: FRAMEWORKS.index(f) for f in Framework}
_IDX_D = {d: DTYPES.index(d) for d in DType}
_ENGINES = [_IDX_F[f] for f in (Framework.VLLM, Framework.TRTLLM, Framework.SGLANG)]
_EAGER = [_IDX_F[f] for f in (Framework.HF, Framework.PEFT)]
# Stacks that run fused (FA3 / cuDNN) attention where the GPU has it.
_FUSED_ATTENTION = [*_ENGINES, _IDX_F[Framework.MEGATRON]]
#: Engine-overhead key per framework; everything else is "other".
ENGINE_KEY: dict[Framework, str] = {
    Framework.VLLM: "vllm",
    Framework.SGLANG: "sglang",
    Framework.TRTLLM: "trtllm",
    Framework.HF: "hf",
    Framework.PEFT: "hf",
}
_ENGINE_KEYS = ("vllm", "sglang", "trtllm", "hf", "other")
_FRAMEWORK_TO_ENGINE = np.array(
    [_ENGINE_KEYS.index(ENGINE_KEY.get(f, "other")) for f in FRAMEWORKS], dtype=np.int64
)
_NODE_GPUS = 8.0
#: SM boost clock per architecture, MHz: A100 SXM4 1410, H100 / H200 SXM 1980, B200 1980
#: (NVIDIA datasheet values as listed by hmc-tech.com's A100-vs-B200 and H100/H200 spec pages).
BOOST_CLOCK_MHZ: dict[str, float] = {"ampere": 1410.0, "hopper": 1980.0, "blackwell": 1980.0}
#: The latency priors (launch floors, eager collective syncs) are A100 measurements.
_REFERENCE_CLOCK_MHZ = BOOST_CLOCK_MHZ["ampere"]


def latency_scale(gpu_name: str) -> float:
    """Factor on the latency-bound fixed costs of ``gpu_name`` relative to an A100.

    The per-layer kernel-launch floors and an eager stack's per-collective synchronisation are
    chains of short dependent steps (host issue, kernel prologues, barrier waits), bound by
    clocks rather than by HBM bandwidth or tensor-core peak. Their priors are A100 figures, so
    they are timed at the A100's boost clock and scale with ``1 / clock``. The hosts that
    carry the newer GPUs also have faster CPUs (DGX H100: Xeon 8480C; DGX A100: EPYC 7742),
    which this same factor stands in for: host speed is not modelled on its own. The
    serving engine's scheduling work (``engine.*``) does not scale.
    """
    return _REFERENCE_CLOCK_MHZ / BOOST_CLOCK_MHZ[gpu_architecture(gpu_name)]


def roofline_share(tokens: np.ndarray, ridge_tokens: np.ndarray, p: float) -> np.ndarray:
    """Share of its compute-bound throughput a GEMM over ``tokens`` rows reaches.

    A GEMM over ``T`` tokens takes the p-norm of its compute time (``∝ T``) and its
    weight-read time (``∝ ridge``, constant): ``t = (t_c^p + t_m^p)^(1/p)``, so its share of
    the compute-bound rate is ``1 / (1 + (ridge / T)^p)^(1/p)``. ``p = 1`` sums the two times
    (no overlap), ``p → ∞`` is the ideal roofline (their maximum). Far above the ridge the
    share tends to 1 (compute-bound); far below it to ``T / ridge`` (time = one weight read).
    """
    ratio = np.asarray(ridge_tokens, dtype=np.float64) / np.asarray(tokens, dtype=np.float64)
    return 1.0 / (1.0 + ratio**p) ** (1.0 / p)


@dataclass(frozen=True)
class RuntimeModel:
    """The runtime model's constants: one :class:`Efficiencies` table (fitted or prior)."""

    efficiencies: Efficiencies = field(default_factory=default_efficiencies)


@dataclass(frozen=True)
class _Gpus:
    """Per-GPU rows, each ``(1, n_gpus)``."""

    names: tuple[str, ...]
    bw: np.ndarray  # HBM bytes/s
    link: np.ndarray  # one-direction intra-node bytes/s
    fused_attn: np.ndarray  # Hopper/Blackwell have FA3-class kernels
    has_fp8: np.ndarray
    has_fp4: np.ndarray
    peak_by_dtype: np.ndarray  # (n_dtypes, n_gpus) FLOP/s
    lat: np.ndarray  # latency-bound fixed costs relative to an A100 (1 / boost clock)
    per_job: bool = False  # one GPU per job: every row is (n_jobs, 1) instead of (1, n_gpus)

    def arch(self, eff: Efficiencies, prefix: str) -> np.ndarray:
        """``<prefix>.<architecture>`` for each GPU, shaped like the other rows."""
        return eff.per_arch(prefix, self.names).reshape(self.bw.shape)


def _gpus(gpus: Sequence[GpuType], eff: Efficiencies, per_job: bool = False) -> _Gpus:
    """GPU rows for a jobs × GPUs table, or (``per_job``) one GPU per job, ``(n_jobs, 1)``."""

    def row(v: list[float] | list[bool]) -> np.ndarray:
        a = np.asarray(v, dtype=np.float64)
        return a[:, None] if per_job else a[None, :]

    pcie = eff["comm.pcie_gbps"]
    return _Gpus(
        names=tuple(g.name for g in gpus),
        bw=row([g.hbm_bandwidth_gbps * 1e9 for g in gpus]),
        link=row([(g.nvlink_bandwidth_gbps / 2 or pcie) * 1e9 for g in gpus]),
        fused_attn=row([gpu_architecture(g.name) != "ampere" for g in gpus]),
        has_fp8=row(["fp8" in g.peak_tflops for g in gpus]),
        has_fp4=row(["fp4" in g.peak_tflops for g in gpus]),
        peak_by_dtype=np.array(
            [[g.peak_tflops_for(d.value) * 1e12 for g in gpus] for d in DTYPES], dtype=np.float64
        ),
        lat=row([latency_scale(g.name) for g in gpus]),
        per_job=per_job,
    )


def _col(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)[..., None]


def allreduce_s(
    nbytes: np.ndarray, group: np.ndarray, link: np.ndarray, eff: Efficiencies
) -> np.ndarray:
    """All-reduce of ``nbytes`` over ``group`` GPUs: latency growing with ``log2(p)`` (tree /
    NVLS algorithms for small messages) plus the ring's ``2(p−1)/p`` of the bytes over the
    achieved link bandwidth. Zero for a group of one."""
    p = np.maximum(group, 1.0)
    latency = eff["comm.latency_s"] + eff["comm.latency_log2_s"] * np.log2(p)
    ring = 2.0 * (p - 1.0) / p * nbytes / (link * eff["comm.link_efficiency"])
    return np.where(p > 1.0, latency + ring, 0.0)


def _gemm_eff(
    j: JobArrays, g: _Gpus, eff: Efficiencies, base: np.ndarray, tokens: np.ndarray
) -> np.ndarray:
    """GEMM share of peak: ``base`` per architecture × size and dtype factors, ``(n, G)``."""
    hid = j.hidden / j.tp
    size = hid / (hid + eff["gemm.knee_hidden"])
    # A GEMM over T tokens does 2T FLOPs per weight element it reads, so it is bandwidth-bound
    # below the GPU's ridge point (peak FLOP/s over HBM bytes/s, in tokens): the knee is that
    # ridge, not a fixed token count (A100 ~150 tokens, H100 ~300 at bf16).
    ridge = _peak(j, g) * _col(j.weight_bytes) / (2.0 * g.bw)
    tok = roofline_share(_col(tokens), eff["gemm.knee_ridge"] * ridge, eff["gemm.roofline_p"])
    fp8 = (j.compute_dtype == _IDX_D[DType.FP8])[:, None] & (g.has_fp8 > 0)
    fp4 = (j.compute_dtype == _IDX_D[DType.FP4])[:, None] & (g.has_fp4 > 0)
    low = np.where(fp8, eff["gemm.fp8_scale"], 1.0) * np.where(fp4, eff["gemm.fp4_scale"], 1.0)
    moe = np.where(j.is_moe > 0, eff["gemm.moe_scale"], 1.0)
    return base * low * tok * _col(size * moe)


def _routed_share(j: JobArrays) -> np.ndarray:
    """Share of a token's matmul FLOPs spent in routed experts (0 for dense models)."""
    idle = np.maximum(j.n_experts - j.n_active_experts, 1.0)
    routed_active = (j.total_params - j.active_params) * j.n_active_experts / idle
    return np.where(j.is_moe > 0, np.clip(routed_active / j.flop_params, 0.0, 1.0), 0.0)


def _gemm_s(
    j: JobArrays,
    g: _Gpus,
    eff: Efficiencies,
    base: np.ndarray,
    flops: np.ndarray,
    tokens: np.ndarray,
    scale: np.ndarray,
) -> np.ndarray:
    """Seconds of ``flops`` matmul work over ``tokens`` tokens per GEMM, ``(n, G)``.

    Dense GEMMs see every token; a routed expert sees only ``tokens·k/E`` of them (balanced
    routing), so its GEMMs sit lower on the ridge-point knee. ``scale`` is the stack's factor.
    """
    share = _routed_share(j)
    per_expert = tokens * j.n_active_experts / np.maximum(j.n_experts, 1.0)
    peak = _peak(j, g) * _col(scale)
    dense = _col(flops * (1.0 - share)) / (peak * _gemm_eff(j, g, eff, base, tokens))
    routed = _col(flops * share) / (peak * _gemm_eff(j, g, eff, base, per_expert))
    return dense + routed


def _attn_eff(j: JobArrays, g: _Gpus, eff: Efficiencies, seq: np.ndarray) -> np.ndarray:
    fa2 = g.arch(eff, "attn.fa2")
    fa3 = np.array([eff[f"attn.fa3.{a}"] if a != "ampere" else 0.0 for a in _archs(g)])
    fa3 = fa3.reshape(g.bw.shape)
    fused = np.isin(j.framework, _FUSED_ATTENTION)[:, None] & (g.fused_attn > 0)
    return np.where(fused, fa3, fa2) * _col(seq / (seq + eff["attn.knee_seq"]))


def _archs(g: _Gpus) -> list[str]:
    return [gpu_architecture(n) for n in g.names]


def _elem_bytes_per_token(j: JobArrays, eff: Efficiencies) -> np.ndarray:
    """HBM traffic of one layer's elementwise forward work per token (norms, act, residual).

    A MoE layer also permutes each token's ``k`` routed copies into expert order and back
    (gather + scatter, each a read and a write of ``k·hidden`` values): memory traffic, not
    matmul work.
    """
    dense = 16.0 * j.hidden + 4.0 * j.ffn
    permute = np.where(j.is_moe > 0, 4.0 * j.n_active_experts * j.hidden, 0.0)
    return eff["elem.bytes_scale"] * j.compute_bytes * (dense + permute) / j.tp


def _expert_parallel(j: JobArrays) -> np.ndarray:
    """The all-to-all group of a MoE job: its experts spread over the data-parallel ranks of
    one node (JobSpec has no expert-parallel degree; Megatron's EP divides DP), 1 if dense."""
    ep = np.minimum(np.minimum(j.dp, j.n_experts), _NODE_GPUS)
    return np.where(j.is_moe > 0, np.maximum(ep, 1.0), 1.0)


def _moe_alltoall_s(j: JobArrays, g: _Gpus, eff: Efficiencies, ck: np.ndarray) -> np.ndarray:
    """Token dispatch and combine of every MoE layer in one step, ``(n, G)``.

    Each micro-batch sends every token's ``k`` routed copies (``k·hidden`` values, divided
    over the TP ranks that hold the sequence's shards) to the GPUs that hold those experts
    and back: two all-to-alls forward, two backward, two more per recomputed forward. An
    all-to-all over ``p`` GPUs moves ``(p−1)/p`` of the bytes over each GPU's link.
    """
    p = _expert_parallel(j)
    msg = j.batch * j.seq_len * j.n_active_experts * j.hidden * j.compute_bytes / j.tp
    calls = (4.0 + 2.0 * ck) * (j.n_layers / j.pp) * j.grad_accum
    one = eff["comm.latency_s"] + _col(msg * (p - 1.0) / p) / (g.link * eff["comm.link_efficiency"])
    return np.where(_col(p) > 1.0, eff["comm.a2a_exposed"] * _col(calls) * one, 0.0)


def _engine_lookup(j: JobArrays, eff: Efficiencies, kind: str) -> np.ndarray:
    table = np.array([eff[f"engine.{kind}.{k}"] for k in _ENGINE_KEYS])
    return table[_FRAMEWORK_TO_ENGINE[j.framework.astype(np.int64)]]


def _engine_step_s(j: JobArrays, eff: Efficiencies, batch: np.ndarray) -> np.ndarray:
    """The engine's CPU work in one step: fixed plus per running sequence (sampling, detok)."""
    return _engine_lookup(j, eff, "step_s") + _engine_lookup(j, eff, "seq_step_s") * batch


def _uncaptured(j: JobArrays) -> np.ndarray:
    """1 where collectives launch without CUDA graphs / custom all-reduce (not an engine)."""
    return (~np.isin(j.framework, _ENGINES)).astype(np.float64)


def _uncaptured_sync_s(j: JobArrays, eff: Efficiencies) -> np.ndarray:
    """Host-side cost of one collective in a stack without CUDA graphs, per call.

    Each TP rank is its own host process issuing kernels eagerly, so every all-reduce is a
    barrier that waits for the slowest of ``p`` ranks: the cost grows with the group (as
    ``log2(p)``, the depth of the synchronisation), not a flat latency. Zero for TP 1 and for
    graph-captured engines.
    """
    return _uncaptured(j) * eff["comm.uncaptured_latency_s"] * np.log2(np.maximum(j.tp, 1.0))


def _peak(j: JobArrays, g: _Gpus) -> np.ndarray:
    idx = j.compute_dtype.astype(np.int64)
    if g.per_job:
        return g.peak_by_dtype[idx, np.arange(idx.size)][:, None]
    return g.peak_by_dtype[idx]


# ------------------------------------------------------------------------------ training
def _training_step_s(j: JobArrays, g: _Gpus, eff: Efficiencies) -> tuple[np.ndarray, np.ndarray]:
    """Step time and its saturating (busy) part, ``(n, G)`` each."""
    is_peft = np.isin(j.task, [_IDX_T[Task.LORA], _IDX_T[Task.QLORA]])
    ck = j.checkpointing
    tp, pp, dp = j.tp, j.pp, j.dp
    tokens_mb = j.batch * j.seq_len
    per_gpu = tokens_mb * j.grad_accum / (tp * pp)  # tokens × (1/TP·PP share of the work)
    gemm_flops = (np.where(is_peft, 4.0, 6.0) + 2.0 * ck) * j.flop_params * per_gpu
    attn_flops = (3.5 + ck) * 2.0 * j.n_layers * j.seq_len * j.attn_dim * per_gpu
    peak = _peak(j, g)
    scale = np.where(np.isin(j.framework, _EAGER), eff["gemm.eager_scale"], 1.0)
    scale = scale * np.where(j.task == _IDX_T[Task.QLORA], eff["gemm.qlora_scale"], 1.0)
    gemm_s = _gemm_s(j, g, eff, g.arch(eff, "gemm"), gemm_flops, tokens_mb, scale)
    attn_s = _col(attn_flops) / (peak * _attn_eff(j, g, eff, j.seq_len))
    elem_bytes = (3.0 + ck) * j.n_layers * _elem_bytes_per_token(j, eff) * per_gpu
    elem_s = _col(elem_bytes) / (g.bw * eff["mem.stream"])
    launch_s = (
        _col(eff["launch.train_s"] * (j.n_layers / pp) * j.grad_accum * (1.0 + ck / 3.0)) * g.lat
    )
    tp_msgs = (4.0 + 2.0 * ck) * (j.n_layers / pp) * j.grad_accum
    tp_s = (
        eff["comm.tp_exposed_train"]
        * _col(tp_msgs)
        * allreduce_s(_col(tokens_mb * j.hidden * j.compute_bytes), _col(tp), g.link, eff)
    )
    inter = _col(j.n_gpus) > _NODE_GPUS
    dp_link = np.where(inter, eff["comm.inter_node_gbps"] * 1e9, g.link)
    trainable = np.where(is_peft, j.lora_params, j.total_params) / (tp * pp)
    grad_bytes = trainable * 2.0 * np.where(j.zero_stage >= 3, 1.5, 1.0)
    dp_s = eff["comm.dp_exposed"] * allreduce_s(_col(grad_bytes), _col(dp), dp_link, eff)
    bubble = _col(1.0 + (pp - 1.0) / np.maximum(j.grad_accum, 1.0))
    busy = gemm_s + attn_s + elem_s
    step = (busy + launch_s + tp_s + _moe_alltoall_s(j, g, eff, ck)) * bubble + dp_s
    return step, busy * bubble


# ------------------------------------------------------------------------------ inference
def prefill_s(
    j: JobArrays,
    g: _Gpus,
    eff: Efficiencies,
    weights_bytes_per_gpu: np.ndarray,
    batch: np.ndarray,
    input_len: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Time to prefill ``batch`` prompts of ``input_len`` tokens (TTFT) and its busy part.

    A single batch flows through the pipeline stages one after another, so latency sums the
    stages: work is divided by TP only.
    """
    tp = j.tp
    tokens = batch * input_len
    peak = _peak(j, g)
    gemm_flops = 2.0 * j.flop_params * tokens / tp
    attn_flops = 2.0 * j.n_layers * batch * input_len**2 * j.attn_dim / tp
    unfused = np.where(np.isin(j.framework, _ENGINES), 1.0, eff["prefill.unfused_scale"])
    gemm_s = _gemm_s(j, g, eff, g.arch(eff, "prefill"), gemm_flops, tokens, unfused)
    attn_s = _col(attn_flops) / (peak * _attn_eff(j, g, eff, input_len))
    elem_s = _col(j.n_layers * _elem_bytes_per_token(j, eff) * tokens) / (g.bw * eff["mem.stream"])
    weight_s = _col(weights_bytes_per_gpu * j.pp) / (g.bw * _mbu(j, g, eff))
    busy = np.maximum(gemm_s + attn_s + elem_s, weight_s)
    tp_s = _col(2.0 * j.n_layers) * (
        allreduce_s(_col(tokens * j.hidden * j.compute_bytes), _col(tp), g.link, eff)
        + _col(_uncaptured_sync_s(j, eff)) * g.lat
    )
    launch_s = _col(eff["launch.prefill_s"] * j.n_layers) * g.lat
    return busy + tp_s + launch_s + _col(_engine_step_s(j, eff, batch)), busy


def _mbu(j: JobArrays, g: _Gpus, eff: Efficiencies) -> np.ndarray:
    scale = np.where(np.isin(j.framework, _EAGER), eff["decode.eager_scale"], 1.0)
    return g.arch(eff, "decode.mbu") * _col(scale)


def decode_step_s(
    j: JobArrays,
    g: _Gpus,
    eff: Efficiencies,
    weights_bytes_per_gpu: np.ndarray,
    batch: np.ndarray,
    context_len: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One decode step of ``batch`` running sequences with ``context_len`` cached tokens each.

    Returns (step time, busy part). Under continuous batching ``batch`` is the running batch
    and ``context_len`` its mean KV length; MoE layers read only the experts the batch routes
    to, ``E·(1 − (1 − k/E)^b)`` of them.
    """
    tp = j.tp
    expert_frac = np.where(
        j.is_moe > 0,
        1.0 - (1.0 - j.n_active_experts / np.maximum(j.n_experts, 1.0)) ** batch,
        1.0,
    )
    # Every routed expert of every MoE layer, per GPU: the params a token does not touch are
    # (E − k) experts per MoE layer, so all E of them are (total − active)·E/(E − k).
    idle = np.maximum(j.n_experts - j.n_active_experts, 1.0)
    routed = np.where(j.is_moe > 0, (j.total_params - j.active_params) * j.n_experts / idle, 0.0)
    expert_bytes = routed * j.weight_bytes / tp
    weight_bytes = weights_bytes_per_gpu * j.pp - expert_bytes * (1.0 - expert_frac)
    kv_bytes = j.n_layers * j.kv_dim / tp * j.kv_bytes * batch * context_len
    mem_s = _col(weight_bytes + kv_bytes) / (g.bw * _mbu(j, g, eff))
    fp8 = (j.compute_dtype == _IDX_D[DType.FP8])[:, None] & (g.has_fp8 > 0)
    comp_eff = eff["decode.compute_eff"] * np.where(fp8, eff["gemm.fp8_scale"], 1.0)
    comp_s = _col(2.0 * j.flop_params * batch / tp) / (_peak(j, g) * comp_eff)
    busy = np.maximum(mem_s, comp_s)
    launch = np.select(
        [np.isin(j.framework, _ENGINES), np.isin(j.framework, _EAGER)],
        [eff["launch.decode_engine_s"], eff["launch.decode_eager_s"]],
        eff["launch.decode_other_s"],
    )
    tp_s = _col(2.0 * j.n_layers) * (
        allreduce_s(_col(batch * j.hidden * j.compute_bytes), _col(tp), g.link, eff)
        + _col(_uncaptured_sync_s(j, eff)) * g.lat
    )
    fixed = _col(launch * j.n_layers) * g.lat + _col(_engine_step_s(j, eff, batch))
    return busy + tp_s + fixed, busy


# ------------------------------------------------------------------------------ driver
def runtime_figures(
    j: JobArrays,
    gpus: Sequence[GpuType],
    weights_bytes_per_gpu: np.ndarray,
    rm: RuntimeModel | None = None,
    per_job: bool = False,
) -> dict[str, np.ndarray]:
    """``runtime_s``, ``step_time_s``, ``ttft_s``, ``tpot_s`` and ``busy_frac`` as
    ``(n_jobs, n_gpus)`` arrays (``per_job``: ``gpus[i]`` is job i's GPU, arrays ``(n, 1)``).

    ``weights_bytes_per_gpu`` is the weights term of the memory model (what decode reads).
    NaN marks a figure that does not apply to the task. ``busy_frac`` is the share of the
    runtime during which the bottleneck resource (tensor cores or HBM) is saturated: only that
    share stretches on a smaller MIG slice; launch floors, engine CPU work and collectives do
    not.
    """
    rm = rm or RuntimeModel()
    # Training and inference formulas are evaluated for every job and masked at the end, so
    # the branch that does not apply divides by zero-length sequences; silence those NaNs.
    with np.errstate(divide="ignore", invalid="ignore"):
        return _runtime_figures(
            j, _gpus(gpus, rm.efficiencies, per_job), weights_bytes_per_gpu, rm.efficiencies
        )


def _runtime_figures(
    j: JobArrays, g: _Gpus, weights_bytes_per_gpu: np.ndarray, eff: Efficiencies
) -> dict[str, np.ndarray]:
    is_infer = _col(j.task == _IDX_T[Task.INFERENCE])
    step_s, train_busy = _training_step_s(j, g, eff)
    ttft, prefill_busy = prefill_s(j, g, eff, weights_bytes_per_gpu, j.batch, j.input_len)
    mean_ctx = j.input_len + j.output_len / 2.0
    tpot, decode_busy = decode_step_s(j, g, eff, weights_bytes_per_gpu, j.batch, mean_ctx)
    replicas = np.maximum(j.dp, 1.0)
    batches = _col(np.ceil(j.num_requests / (j.batch * replicas)))
    decode_steps = _col(np.maximum(j.output_len - 1.0, 0.0))
    request_s = _col(_engine_lookup(j, eff, "request_s") * j.num_requests / replicas)
    infer_runtime = batches * (ttft + decode_steps * tpot) + request_s
    infer_busy = batches * (prefill_busy + decode_steps * decode_busy)
    busy_frac = np.where(
        is_infer, infer_busy / np.maximum(infer_runtime, 1e-12), train_busy / step_s
    )
    nan = np.full_like(step_s, np.nan)
    return {
        "busy_frac": np.clip(np.nan_to_num(busy_frac, nan=1.0), 0.0, 1.0),
        "runtime_s": np.where(is_infer, infer_runtime, step_s * _col(j.steps)),
        "step_time_s": np.where(is_infer, nan, step_s),
        "ttft_s": np.where(is_infer, ttft, nan),
        "tpot_s": np.where(is_infer, tpot, nan),
    }
