"""Build the real Hugging Face model of a :class:`ModelArch` on the meta device.

The config is made from the catalogue's numbers (or a ``config.json`` read offline); nothing is
downloaded and no weight is materialised. Families whose HF modules the tracer cannot run
shape-only raise :class:`TraceUnsupported` with the reason, and the analytical tier answers.

The mapping mirrors the profiling harness (``workers/_profile_model.py``), which the predictor
cannot import (workers depend on the predictor, not the reverse).
"""

from __future__ import annotations

import os
from typing import Any

from ..models import ModelArch
from .exceptions import TraceUnsupported

__all__ = ["build_meta_model", "hf_config", "hf_family"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")


def hf_family(arch: ModelArch) -> str:
    """The HF ``model_type`` that reproduces ``arch``; raises :class:`TraceUnsupported`."""
    family = arch.family if arch.family and arch.family != "generic" else ""
    if arch.uses_mla or family in ("deepseek_v2", "deepseek_v3"):
        raise TraceUnsupported(f"{arch.name}: multi-head latent attention (MLA) is not traced")
    if family in ("gpt_oss", "mpt"):
        raise TraceUnsupported(f"{arch.name}: family {family!r} has no shape-only tracer path")
    if family in (*_DENSE, "gpt2", "bert", "mixtral", "qwen2_moe", "qwen3_moe"):
        return family
    if family == "roberta" or arch.encoder_only:
        return "bert"
    if not arch.gated_mlp and arch.norm == "layernorm" and arch.position == "learned":
        return "gpt2"
    if arch.gated_mlp and arch.norm == "rmsnorm":
        if not arch.is_moe:
            return "llama"
        if arch.n_shared_experts == 0 and arch.n_dense_layers == 0:
            return "qwen3_moe" if arch.moe_intermediate_size else "mixtral"
        return "qwen2_moe"
    raise TraceUnsupported(
        f"{arch.name}: no HF class matches gated_mlp={arch.gated_mlp}, norm={arch.norm!r}, "
        f"position={arch.position!r}"
    )


def hf_config(arch: ModelArch) -> Any:
    """A transformers config object for ``arch``."""
    from transformers import AutoConfig

    family = hf_family(arch)
    common: dict[str, Any] = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
        "max_position_embeddings": max(arch.max_position_embeddings, 8),
        "tie_word_embeddings": arch.tie_embeddings,
        "pad_token_id": 0,
        "bos_token_id": 0,
        "eos_token_id": None,
    }
    if family == "gpt2":
        if arch.n_kv_heads != arch.n_heads:
            raise TraceUnsupported(f"{arch.name}: GPT-2 has no grouped-query attention")
        kw: dict[str, Any] = {
            "vocab_size": arch.vocab_size,
            "n_embd": arch.hidden_size,
            "n_layer": arch.n_layers,
            "n_head": arch.n_heads,
            "n_inner": arch.intermediate_size,
            "n_positions": arch.max_position_embeddings,
            "tie_word_embeddings": arch.tie_embeddings,
        }
        return AutoConfig.for_model("gpt2", **kw)
    if family == "bert":
        return AutoConfig.for_model(
            "bert",
            vocab_size=arch.vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.n_layers,
            num_attention_heads=arch.n_heads,
            intermediate_size=arch.intermediate_size,
            max_position_embeddings=arch.max_position_embeddings,
            pad_token_id=0,
        )
    attn = {"num_key_value_heads": arch.n_kv_heads, "head_dim": arch.head_dim}
    if family in _DENSE:
        kw = {**common, **attn, "intermediate_size": arch.intermediate_size}
        if family in ("llama", "qwen3"):
            kw["attention_bias"] = arch.attention_bias
        if family == "llama":
            kw["mlp_bias"] = arch.mlp_bias
        if family == "phi3":
            kw.pop("head_dim")
        return AutoConfig.for_model(family, **kw)
    if family == "mixtral":
        return AutoConfig.for_model(
            "mixtral",
            **common,
            **attn,
            intermediate_size=arch.expert_intermediate_size,
            num_local_experts=arch.n_experts,
            num_experts_per_tok=arch.n_active_experts,
        )
    kw = {
        **common,
        **attn,
        "intermediate_size": arch.intermediate_size,
        "moe_intermediate_size": arch.expert_intermediate_size,
        "num_experts": arch.n_experts,
        "num_experts_per_tok": arch.n_active_experts,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(arch.n_dense_layers)),
        "norm_topk_prob": family == "qwen3_moe",
    }
    if family == "qwen2_moe":
        kw["shared_expert_intermediate_size"] = (
            arch.n_shared_experts * arch.expert_intermediate_size
        )
    elif arch.n_shared_experts:
        raise TraceUnsupported(f"{arch.name}: Qwen3-MoE has no shared experts")
    return AutoConfig.for_model(family, **kw)


def build_meta_model(arch: ModelArch, dtype: Any, attn_implementation: str) -> Any:
    """The HF model (causal LM, or masked LM for encoders) on ``meta`` in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config = hf_config(arch)
    auto = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    if arch.is_moe:
        from ._patches import use_uniform_experts

        use_uniform_experts(model)
    return model
