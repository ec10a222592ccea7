"""Build the real Hugging Face model of a :class:`ModelArch` on the meta device.

The config is made from the catalogue's numbers (or a ``config.json`` read offline); nothing is
downloaded and no weight is materialised. Families whose HF modules the tracer cannot run
shape-only raise :class:`TraceUnsupported` with the reason, and the analytical tier answers.

The mapping (:mod:`predictor.arch_to_hf`) is the one the profiling harness builds its GPU models
with, so what is traced is what is measured.
"""

from __future__ import annotations

import os
from typing import Any

from .. import arch_to_hf
from ..exceptions import UnmappedArchError
from ..models import ModelArch
from .exceptions import TraceUnsupported

__all__ = ["build_meta_model", "hf_config", "hf_family", "kv_heads"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def hf_family(arch: ModelArch) -> str:
    """The HF ``model_type`` that reproduces ``arch``; raises :class:`TraceUnsupported`."""
    try:
        return arch_to_hf.hf_family(arch)
    except UnmappedArchError as exc:
        raise TraceUnsupported(str(exc)) from exc


def hf_config(arch: ModelArch) -> Any:
    """A transformers config object for ``arch``; raises :class:`TraceUnsupported`."""
    from transformers import AutoConfig

    try:
        model_type, kwargs = arch_to_hf.hf_config_kwargs(arch)
    except UnmappedArchError as exc:
        raise TraceUnsupported(str(exc)) from exc
    return AutoConfig.for_model(model_type, **kwargs)


def build_meta_model(
    arch: ModelArch, dtype: Any, attn_implementation: str, classify: bool = False
) -> Any:
    """The HF model (causal LM, or masked LM for encoders; with ``classify`` a two-label
    sequence classifier, ``AutoModelForSequenceClassification``) on ``meta`` in ``dtype``."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    config = hf_config(arch)
    auto: Any = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
    if classify:
        auto = AutoModelForSequenceClassification
        config.num_labels = 2  # batch × labels logits: negligible for any label count
        if config.pad_token_id is None:
            config.pad_token_id = 0  # decoders pool the last non-pad token
    with torch.device("meta"):
        model = auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    if arch.is_moe:
        from ._patches import use_uniform_experts

        use_uniform_experts(model)
    return model


def kv_heads(cfg: Any) -> tuple[int, int]:
    """(KV heads, head dim) of a transformers config (MHA configs name no KV heads)."""
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return n_kv, hd
