"""Serving-time model of one deployment: prefill time, decode step time, engine overheads and
which low-precision paths a GPU has.

These are the same roofline functions the analytical tier uses for TTFT and TPOT
(:mod:`predictor._runtime`), with the fitted efficiency table
(:func:`predictor.efficiency.default_efficiencies`), exposed for planners that sweep batch
sizes and context lengths for one model on one GPU type (serving by SLO). Every time function
broadcasts its array arguments with numpy and returns seconds of the same shape.

Continuous batching: a decode step of a running batch of ``b`` sequences whose KV caches hold
``c`` tokens on average costs :func:`decode_step_time_s` ``(b, c)``. It is the larger of
reading the weights + ``b·c`` KV entries at the GPU's achieved bandwidth and the batch's GEMMs,
plus the per-layer launch floor, the TP all-reduces and the engine's per-step CPU work
(:func:`engine_overheads`: fixed + per running sequence). A request also pays
``EngineOverheads.request_s`` once (tokenise, detokenise, bookkeeping).

Low precision: FP8 tensor-core compute exists from Hopper on, FP4 only on Blackwell
(:func:`compute_dtype_supported`). FP8/FP4 *weights* on an older GPU run weight-only (dequantised
into bf16 GEMMs), which is what these functions assume when ``compute_dtype`` is not given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ._jobarrays import JobArrays, job_arrays
from ._memory import GIB, MemoryModel, memory_breakdown_gib
from ._runtime import _gpus, decode_step_s, prefill_s
from .efficiency import Efficiencies, default_efficiencies
from .exceptions import SpecError
from .gpus import get_gpu
from .spec import DType, Framework, JobSpec, parse_spec

__all__ = [
    "EngineOverheads",
    "check_dtype_supported",
    "compute_dtype_supported",
    "decode_step_time_s",
    "engine_overheads",
    "prefill_time_s",
]

_LOW_PRECISION = {DType.FP8: "fp8", DType.FP4: "fp4"}
_FIRST_GPU = {DType.FP8: "Hopper (H100/H200) or newer", DType.FP4: "Blackwell (B200)"}


@dataclass(frozen=True, slots=True)
class EngineOverheads:
    """CPU-side costs of a serving framework, nearly independent of the GPU."""

    framework: str
    step_s: float  # per engine step (scheduling, launch of the step)
    seq_step_s: float  # per running sequence per step (sampling, detokenisation)
    request_s: float  # once per request (tokenise, admit, finish)


def engine_overheads(
    framework: str | Framework = "vllm", eff: Efficiencies | None = None
) -> EngineOverheads:
    """The per-step, per-sequence-step and per-request overheads of ``framework``.

    vllm, sglang, trtllm and hf (peft counts as hf) have their own; any other framework gets
    the ``other`` entry.
    """
    from ._runtime import ENGINE_KEY

    eff = eff or default_efficiencies()
    key = ENGINE_KEY.get(Framework(framework), "other")
    return EngineOverheads(
        framework=key,
        step_s=eff[f"engine.step_s.{key}"],
        seq_step_s=eff[f"engine.seq_step_s.{key}"],
        request_s=eff[f"engine.request_s.{key}"],
    )


def compute_dtype_supported(gpu: str, dtype: str | DType) -> bool:
    """True when ``gpu`` has tensor cores for ``dtype`` (FP8: Hopper+, FP4: Blackwell)."""
    d = DType(dtype)
    name = _LOW_PRECISION.get(d)
    return name is None or name in get_gpu(gpu).peak_tflops


def check_dtype_supported(gpu: str, dtype: str | DType) -> None:
    """Raise :class:`SpecError` when ``gpu`` cannot compute in ``dtype``."""
    d = DType(dtype)
    if not compute_dtype_supported(gpu, d):
        raise SpecError(
            f"`compute_dtype` {d.value} needs {_FIRST_GPU[d]}; {gpu} has no {d.value} tensor "
            f"cores. Use compute_dtype bf16 (weight-only {d.value}) or another GPU"
        )


def _deployment(
    model: str | Mapping[str, Any],
    gpu: str,
    tensor_parallel: int,
    framework: str | Framework,
    weight_dtype: str,
    compute_dtype: str | None,
    kv_cache_dtype: str | None,
) -> tuple[JobSpec, JobArrays, float]:
    weight = DType(weight_dtype)
    if compute_dtype is None:
        compute = weight if compute_dtype_supported(gpu, weight) else DType.BF16
        if compute in (DType.INT8, DType.INT4, DType.NF4):
            compute = DType.BF16
    else:
        compute = DType(compute_dtype)
        check_dtype_supported(gpu, compute)
    spec = parse_spec(
        {
            "model": model,
            "task": "inference",
            "framework": Framework(framework).value,
            "weight_dtype": weight.value,
            "compute_dtype": compute.value,
            "kv_cache_dtype": kv_cache_dtype or None,
            "batch_size": 1,
            "input_len": 1,
            "output_len": 1,
            "num_requests": 1,
            "n_gpus": tensor_parallel,
            "tensor_parallel": tensor_parallel,
        }
    )
    j = job_arrays([spec])
    weights = float(memory_breakdown_gib(j, (gpu,), MemoryModel())["weights"][0, 0]) * GIB
    return spec, j, weights


def _tile(j: JobArrays, n: int) -> JobArrays:
    return replace(j, **{f.name: np.repeat(getattr(j, f.name), n) for f in fields(JobArrays)})


def _evaluate(fn: Any, gpu: str, j: JobArrays, weights: float, a: Any, b: Any, eff: Any) -> Any:
    aa, bb = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    flat_a, flat_b = aa.ravel(), bb.ravel()
    jt = _tile(j, flat_a.size)
    g = _gpus([get_gpu(gpu)], eff)
    with np.errstate(divide="ignore", invalid="ignore"):
        t, _ = fn(jt, g, eff, np.full(flat_a.size, weights), flat_a, flat_b)
    return t[:, 0].reshape(aa.shape)


def prefill_time_s(
    model: str | Mapping[str, Any],
    gpu: str,
    batch: Any,
    input_len: Any,
    *,
    tensor_parallel: int = 1,
    framework: str | Framework = "vllm",
    weight_dtype: str = "bf16",
    compute_dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    eff: Efficiencies | None = None,
) -> np.ndarray:
    """Seconds to prefill ``batch`` prompts of ``input_len`` tokens in one step (TTFT of that
    step, queueing excluded) on one TP group of ``gpu``.

    ``model`` is a catalogue name or an explicit architecture object (as in a JobSpec).
    Compute-bound for long prompts (GEMMs + attention at their fitted efficiencies); never
    faster than reading the weights once; plus per-layer launch, TP all-reduces and one engine
    step. Raises :class:`SpecError` for a ``compute_dtype`` the GPU lacks.
    """
    eff = eff or default_efficiencies()
    _, j, w = _deployment(
        model, gpu, tensor_parallel, framework, weight_dtype, compute_dtype, kv_cache_dtype
    )
    return np.asarray(_evaluate(prefill_s, gpu, j, w, batch, input_len, eff))


def decode_step_time_s(
    model: str | Mapping[str, Any],
    gpu: str,
    running_batch: Any,
    context_len: Any,
    *,
    tensor_parallel: int = 1,
    framework: str | Framework = "vllm",
    weight_dtype: str = "bf16",
    compute_dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    eff: Efficiencies | None = None,
) -> np.ndarray:
    """Seconds of one decode step for ``running_batch`` sequences holding ``context_len``
    cached tokens each (their mean, under continuous batching): the TPOT at that load.

    Bandwidth-bound at small batches (weights + KV read at the fitted MBU), compute-bound at
    large ones; plus launch floor, TP all-reduces and the engine's per-step and per-sequence
    CPU work. MoE models read only the experts the batch routes to.
    """
    eff = eff or default_efficiencies()
    _, j, w = _deployment(
        model, gpu, tensor_parallel, framework, weight_dtype, compute_dtype, kv_cache_dtype
    )
    return np.asarray(_evaluate(decode_step_s, gpu, j, w, running_batch, context_len, eff))
