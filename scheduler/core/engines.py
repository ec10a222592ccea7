"""Serving engines take a fixed fraction of the GPU at start-up; this is what they take.

vLLM, SGLang and TensorRT-LLM pre-allocate their KV cache up to a memory fraction of the device
(vLLM ``--gpu-memory-utilization`` 0.9, SGLang ``--mem-fraction-static`` about 0.88, TRT-LLM
``kv_cache_free_gpu_memory_fraction`` 0.9 of what is left after the weights), whatever the job
needs. A job is *told* its reservation when its ``command`` (or an ``env`` value) carries a
placeholder the worker fills in (``{gpu_memory_utilization}``, ``{mem_fraction_static}``,
``{kv_cache_free_gpu_memory_fraction}``; :mod:`workers.engines`): then it takes what it was
reserved. A job that cannot be told takes the engine's default, so it is reserved that fraction
of a whole GPU, and no slice or share smaller than that can hold it. A job without a command
runs simulated and has no engine to tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from predictor.gpus import GPU_NAMES, get_gpu

__all__ = [
    "ENGINE_DEFAULT_FRACTION",
    "ENGINE_FLAG",
    "PLACEHOLDERS",
    "can_be_told",
    "engine_upper_gib",
    "is_engine",
]

#: The fraction of a whole GPU each engine takes when nobody tells it otherwise. TRT-LLM's KV
#: cache takes 0.9 of the memory left after the weights, so it takes nearly all of it.
ENGINE_DEFAULT_FRACTION: dict[str, float] = {"vllm": 0.9, "sglang": 0.88, "trtllm": 1.0}

#: The engine flag each placeholder is meant for.
ENGINE_FLAG: dict[str, str] = {
    "vllm": "--gpu-memory-utilization {gpu_memory_utilization}",
    "sglang": "--mem-fraction-static {mem_fraction_static}",
    "trtllm": "KvCacheConfig(free_gpu_memory_fraction={kv_cache_free_gpu_memory_fraction})",
}

PLACEHOLDERS = (
    "{gpu_memory_utilization}",
    "{mem_fraction_static}",
    "{kv_cache_free_gpu_memory_fraction}",
)


def is_engine(framework: Any) -> bool:
    value = getattr(framework, "value", framework)
    return value in ENGINE_DEFAULT_FRACTION


def can_be_told(command: Sequence[str] | None, env: Mapping[str, str] | None) -> bool:
    """Whether the job's command or environment takes its memory fraction from the worker."""
    texts = [*(command or ()), *(env or {}).values()]
    return any(p in str(t) for t in texts for p in PLACEHOLDERS)


def engine_upper_gib(
    framework: Any,
    command: Sequence[str] | None,
    env: Mapping[str, str] | None,
    upper_gib: Sequence[float | None],
) -> list[float | None]:
    """The per-type upper bound to reserve (aligned with ``GPU_NAMES``): the prediction, or for
    an engine job that cannot be told, at least the engine's default share of a whole GPU."""
    value = getattr(framework, "value", framework)
    if not command or value not in ENGINE_DEFAULT_FRACTION or can_be_told(command, env):
        return list(upper_gib)
    frac = ENGINE_DEFAULT_FRACTION[value]
    return [
        None if u is None else max(u, frac * get_gpu(name).memory_gib)
        for name, u in zip(GPU_NAMES, upper_gib, strict=True)
    ]
