"""Telling a serving engine the memory it was reserved: placeholders and environment variables.

For each real job the worker computes, from its placement (reservation and slot capacity) and
its prediction's breakdown:

- ``gpu_memory_utilization`` (vLLM ``--gpu-memory-utilization``): reservation / capacity; vLLM
  budgets weights, activations and KV cache inside it.
- ``mem_fraction_static`` (SGLang ``--mem-fraction-static``): (reservation - activations, logits
  and overhead) / capacity; SGLang's weights and KV pool are the static part, its activations
  come on top.
- ``kv_cache_free_gpu_memory_fraction`` (TRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``):
  the KV budget (reservation - everything but the KV cache) / the memory left after weights and
  activations. On a shared GPU less is left than assumed, so the engine takes less, never more.

Each is written into ``command`` and ``env`` values wherever ``{name}`` appears (nothing else
in them is touched: JSON in an argument stays as it is), and is exported as
``SNUGFIT_<NAME>`` with ``SNUGFIT_RESERVED_GIB``. Fractions are rounded down to 4 decimals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["engine_env", "engine_values", "fill_placeholders"]

_NON_KV = ("weights", "activations", "logits", "overhead")
_DYNAMIC = ("activations", "logits", "overhead")
_MIN, _MAX = 0.01, 0.99


def _part(breakdown: Mapping[str, Any] | None, keys: tuple[str, ...]) -> float | None:
    if not breakdown:
        return None
    try:
        total = sum(float(breakdown.get(k) or 0.0) for k in keys)
    except (TypeError, ValueError):
        return None
    return total if math.isfinite(total) and total >= 0 else None


def _fraction(x: float) -> str:
    x = min(_MAX, max(_MIN, x)) if math.isfinite(x) else _MIN
    return f"{math.floor(x * 10_000) / 10_000:.4f}"


def engine_values(
    reserved_gib: float, capacity_gib: float, breakdown: Mapping[str, Any] | None
) -> dict[str, str]:
    """The three fractions (as the engines' flags take them) for one placement."""
    cap = capacity_gib if capacity_gib > 0 else 1.0
    dynamic = _part(breakdown, _DYNAMIC)
    non_kv = _part(breakdown, _NON_KV)
    dynamic = 0.1 * reserved_gib if dynamic is None else min(dynamic, reserved_gib)
    non_kv = 0.5 * reserved_gib if non_kv is None else min(non_kv, reserved_gib)
    left = cap - non_kv
    return {
        "gpu_memory_utilization": _fraction(reserved_gib / cap),
        "mem_fraction_static": _fraction((reserved_gib - dynamic) / cap),
        "kv_cache_free_gpu_memory_fraction": _fraction(
            (reserved_gib - non_kv) / left if left > 0 else _MIN
        ),
    }


def fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    for name, v in values.items():
        text = text.replace("{" + name + "}", v)
    return text


def engine_env(values: Mapping[str, str], reserved_gib: float) -> dict[str, str]:
    out = {f"SNUGFIT_{k.upper()}": v for k, v in values.items()}
    out["SNUGFIT_RESERVED_GIB"] = f"{reserved_gib:.3f}"
    return out
