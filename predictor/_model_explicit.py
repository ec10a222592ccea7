"""Explicit architecture numbers (the JobSpec ``model`` object) turned into a :class:`ModelArch`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predictor._model_arch import _FIELDS, _INT_FIELDS, EXPLICIT_KEYS, ModelArch
from predictor.exceptions import SpecError

__all__: list[str] = []

_EXTRA_KEYS: tuple[str, ...] = tuple(k for k in _FIELDS if k not in EXPLICIT_KEYS)


def _as_int(key: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise SpecError(f"model.{key} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise SpecError(f"model.{key} must be an integer, got {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise SpecError(f"model.{key} must be {what}, got {value}")
    return value


def _from_explicit(data: Mapping[str, Any]) -> ModelArch:
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise SpecError(
            f"unknown model key {unknown[0]!r}; allowed keys: {', '.join(EXPLICIT_KEYS)} "
            f"(advanced: {', '.join(_EXTRA_KEYS)})"
        )
    required = ("n_layers", "hidden_size", "n_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if data.get(k) is None]
    if missing:
        raise SpecError(
            f"model object is missing {', '.join(missing)}; an explicit model needs "
            f"{', '.join(required)} (optional: n_kv_heads, head_dim, tie_embeddings, "
            "n_experts, n_active_experts, params_b, name)"
        )
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        if key in _INT_FIELDS:
            minimum = 0 if key in ("n_shared_experts", "n_dense_layers") else 1
            kw[key] = _as_int(key, value, minimum=minimum)
        elif key == "params_b":
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SpecError(f"model.params_b must be a positive number, got {value!r}")
            kw[key] = float(value)
        elif key in ("tie_embeddings", "gated_mlp", "attention_bias", "mlp_bias", "encoder_only"):
            if not isinstance(value, bool):
                raise SpecError(f"model.{key} must be true or false, got {value!r}")
            kw[key] = value
        else:
            if not isinstance(value, str):
                raise SpecError(f"model.{key} must be a string, got {value!r}")
            kw[key] = value
    kw.setdefault("name", "custom")
    kw.setdefault("n_kv_heads", kw["n_heads"])
    if "head_dim" not in kw:
        if kw["hidden_size"] % kw["n_heads"]:
            raise SpecError(
                f"model.head_dim is needed: hidden_size {kw['hidden_size']} is not a multiple "
                f"of n_heads {kw['n_heads']}"
            )
        kw["head_dim"] = kw["hidden_size"] // kw["n_heads"]
    return ModelArch(**kw)
