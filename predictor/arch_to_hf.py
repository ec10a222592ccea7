"""Map a :class:`ModelArch` onto the Hugging Face config that reproduces it (the inverse of
:mod:`predictor._model_hf`).

One mapping serves the traced tier (which builds the model on ``meta``) and the profiling harness
(which builds it with random weights on a GPU), so what is traced is what is measured. Families no
HF class reproduces faithfully raise :class:`~predictor.exceptions.UnmappedArchError`; each caller
turns it into its own "unsupported" error.
"""

from __future__ import annotations

from typing import Any

from .exceptions import UnmappedArchError
from .models import ModelArch

__all__ = ["hf_config_kwargs", "hf_family"]

_DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")
_MAPPED = (*_DENSE, "gpt2", "gpt_neox", "bert", "mixtral", "qwen2_moe", "qwen3_moe")
# Families whose HF class has full multi-head attention only, by the name errors give them.
_MHA_ONLY = {"gpt2": "GPT-2", "gpt_neox": "GPT-NeoX"}
# Random weights are fine with these; they match the public configs' values.
_RMS_EPS = 1e-5
_LN_EPS = 1e-5


def hf_family(arch: ModelArch) -> str:
    """The HF ``model_type`` that reproduces ``arch``; raises :class:`UnmappedArchError`."""
    family = arch.family if arch.family and arch.family != "generic" else ""
    if arch.uses_mla or family in ("deepseek_v2", "deepseek_v3", "gpt_oss", "mpt"):
        raise UnmappedArchError(
            f"model {arch.name!r} (family {family or 'generic'!r}) is not reproduced by the HF "
            "classes snugfit maps to: its attention (MLA) or MoE kernels differ; the analytical "
            "tier answers for it, and profiling needs its own serving stack"
        )
    if family in _MAPPED:
        return family
    if family == "roberta" or arch.encoder_only:
        return "bert"
    if not arch.gated_mlp and arch.norm == "layernorm" and arch.position == "learned":
        return "gpt2"
    if (
        not arch.gated_mlp
        and arch.norm == "layernorm"
        and arch.position == "rope"
        and arch.n_kv_heads == arch.n_heads
        and not arch.is_moe
    ):
        # StableLM-alpha, Phi-1/2, Pythia: LayerNorm, GELU MLP, rotary, full multi-head
        # attention, the attention and MLP side by side (GPT-NeoX's parallel residual).
        return "gpt_neox"
    if arch.gated_mlp and arch.norm == "rmsnorm":
        if not arch.is_moe:
            return "llama"  # any other gated RMSNorm decoder is a Llama of the same shape
        if arch.n_shared_experts == 0 and arch.n_dense_layers == 0:
            return "qwen3_moe" if arch.moe_intermediate_size else "mixtral"
        return "qwen2_moe"
    raise UnmappedArchError(
        f"model {arch.name!r}: no Hugging Face class matches gated_mlp={arch.gated_mlp}, "
        f"norm={arch.norm!r}, position={arch.position!r}; set `family` to one of "
        f"{', '.join(_MAPPED)}"
    )


def hf_config_kwargs(arch: ModelArch) -> tuple[str, dict[str, Any]]:
    """``(model_type, config kwargs)`` reproducing ``arch``; raises :class:`UnmappedArchError`.

    ``AutoConfig.for_model(model_type, **kwargs)`` builds the config.
    """
    family = hf_family(arch)
    if family in _MHA_ONLY and arch.n_kv_heads != arch.n_heads:
        raise UnmappedArchError(
            f"model {arch.name!r}: {_MHA_ONLY[family]} has no grouped-query attention"
        )
    # Random weights never produce these ids on purpose: fixed so generate() never stops early.
    ids = {"bos_token_id": 0, "eos_token_id": None, "pad_token_id": 0}
    # The shape keys every mapped config but GPT-2's names the same way.
    shape = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
    }
    if family == "gpt2":
        return "gpt2", {
            "vocab_size": arch.vocab_size,
            "n_embd": arch.hidden_size,
            "n_layer": arch.n_layers,
            "n_head": arch.n_heads,
            "n_inner": arch.intermediate_size,
            "n_positions": arch.max_position_embeddings,
            "tie_word_embeddings": arch.tie_embeddings,
            "layer_norm_epsilon": _LN_EPS,
            **ids,
        }
    if family == "gpt_neox":
        return "gpt_neox", {
            **shape,
            "intermediate_size": arch.intermediate_size,
            "max_position_embeddings": max(arch.max_position_embeddings, 8),
            "tie_word_embeddings": arch.tie_embeddings,
            "attention_bias": arch.attention_bias,
            "use_parallel_residual": True,
            "layer_norm_eps": _LN_EPS,
            **ids,
        }
    if family == "bert":
        return "bert", {
            **shape,
            "intermediate_size": arch.intermediate_size,
            "max_position_embeddings": arch.max_position_embeddings,
            "pad_token_id": 0,
        }
    common: dict[str, Any] = {
        **shape,
        # Tiny explicit test architectures may give 0; RoPE tables need a few positions.
        "max_position_embeddings": max(arch.max_position_embeddings, 8),
        "tie_word_embeddings": arch.tie_embeddings,
        "num_key_value_heads": arch.n_kv_heads,
        "head_dim": arch.head_dim,
        "rms_norm_eps": _RMS_EPS,
        **ids,
    }
    if family in _DENSE:
        return family, _dense_kwargs(arch, family, common)
    if family == "mixtral":
        return "mixtral", {
            **common,
            "intermediate_size": arch.expert_intermediate_size,
            "num_local_experts": arch.n_experts,
            "num_experts_per_tok": arch.n_active_experts,
        }
    kw = {
        **common,
        "intermediate_size": arch.intermediate_size,
        "moe_intermediate_size": arch.expert_intermediate_size,
        "num_experts": arch.n_experts,
        "num_experts_per_tok": arch.n_active_experts,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(arch.n_dense_layers)),
        "norm_topk_prob": family == "qwen3_moe",
    }
    if family == "qwen2_moe":
        shared = arch.n_shared_experts * arch.expert_intermediate_size
        kw["shared_expert_intermediate_size"] = shared
    elif arch.n_shared_experts:
        raise UnmappedArchError(f"model {arch.name!r}: Qwen3-MoE has no shared experts")
    return family, kw


def _dense_kwargs(arch: ModelArch, family: str, common: dict[str, Any]) -> dict[str, Any]:
    kw = {**common, "intermediate_size": arch.intermediate_size}
    if family in ("llama", "qwen3"):
        kw["attention_bias"] = arch.attention_bias
    if family == "llama":
        kw["mlp_bias"] = arch.mlp_bias
    if family == "phi3":
        kw.pop("head_dim")  # Phi-3 derives it; older releases reject it
    return kw
