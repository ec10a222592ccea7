"""Map a snugfit :class:`ModelArch` onto a Hugging Face config, and build it with random weights.

Nothing is downloaded: the config is made from our numbers and the model from ``from_config``.
Families the harness cannot reproduce faithfully raise :class:`UnsupportedJob` so the sweep
records a skip row instead of measuring a different model under the same name.
"""

from __future__ import annotations

import os
from typing import Any

from predictor.models import ModelArch

__all__ = ["UnsupportedJob", "attn_implementation", "build_model", "hf_config_kwargs"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Very small epsilons are fine for random weights; these match the public configs' values.
_RMS_EPS = 1e-5
_LN_EPS = 1e-5


class UnsupportedJob(Exception):
    """The harness cannot run this job faithfully; ``str(exc)`` says why and what would fix it."""


def _generic_family(arch: ModelArch) -> str:
    """Family for an explicit architecture object without ``family``: pick the HF class whose
    structure matches the numbers (gated RMSNorm+RoPE decoder, its MoE form, or GPT-2)."""
    if arch.encoder_only:
        return "bert"
    if not arch.gated_mlp and arch.norm == "layernorm" and arch.position == "learned":
        return "gpt2"
    if arch.gated_mlp and arch.norm == "rmsnorm" and arch.position == "rope":
        if not arch.is_moe:
            return "llama"
        if arch.n_shared_experts == 0 and arch.n_dense_layers == 0:
            return "qwen3_moe" if arch.moe_intermediate_size else "mixtral"
        return "qwen2_moe"
    raise UnsupportedJob(
        f"model {arch.name!r}: no Hugging Face class matches gated_mlp={arch.gated_mlp}, "
        f"norm={arch.norm!r}, position={arch.position!r}; set `family` to one of "
        "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma2, phi3, gpt2, bert"
    )


def hf_config_kwargs(arch: ModelArch) -> tuple[str, dict[str, Any]]:
    """``(model_type, config kwargs)`` reproducing ``arch``; raises :class:`UnsupportedJob`."""
    family = arch.family if arch.family and arch.family != "generic" else _generic_family(arch)
    if arch.uses_mla or family in ("deepseek_v2", "deepseek_v3", "gpt_oss", "mpt"):
        raise UnsupportedJob(
            f"model {arch.name!r} (family {family!r}) is not reproduced by the profiler: its "
            "attention or MoE kernels differ from the mapped HF classes; profile it with its "
            "own serving stack"
        )
    common: dict[str, Any] = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_embeddings,
        # Random weights never produce these ids on purpose; fixed so generate() never stops.
        "bos_token_id": 0,
        "eos_token_id": None,
        "pad_token_id": 0,
    }
    if family == "gpt2":
        if arch.n_kv_heads != arch.n_heads:
            raise UnsupportedJob(f"model {arch.name!r}: GPT-2 has no grouped-query attention")
        return "gpt2", {
            "vocab_size": arch.vocab_size,
            "n_embd": arch.hidden_size,
            "n_layer": arch.n_layers,
            "n_head": arch.n_heads,
            "n_inner": arch.intermediate_size,
            "n_positions": arch.max_position_embeddings,
            "tie_word_embeddings": arch.tie_embeddings,
            "layer_norm_epsilon": _LN_EPS,
            "bos_token_id": 0,
            "eos_token_id": None,
            "pad_token_id": 0,
        }
    if family in ("bert", "roberta"):
        return "bert", {
            "vocab_size": arch.vocab_size,
            "hidden_size": arch.hidden_size,
            "num_hidden_layers": arch.n_layers,
            "num_attention_heads": arch.n_heads,
            "intermediate_size": arch.intermediate_size,
            "max_position_embeddings": arch.max_position_embeddings,
            "pad_token_id": 0,
        }
    attn: dict[str, Any] = {
        "num_key_value_heads": arch.n_kv_heads,
        "head_dim": arch.head_dim,
        "rms_norm_eps": _RMS_EPS,
    }
    if family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"):
        kw = {**common, **attn, "intermediate_size": arch.intermediate_size}
        if family == "llama":
            kw["attention_bias"] = arch.attention_bias
            kw["mlp_bias"] = arch.mlp_bias
        elif family == "qwen3":
            kw["attention_bias"] = arch.attention_bias
        elif family == "phi3":
            kw.pop("head_dim")  # Phi-3 derives it; passing it is rejected by older releases
        return family, kw
    if family == "mixtral":
        return "mixtral", {
            **common,
            **attn,
            "intermediate_size": arch.expert_intermediate_size,
            "num_local_experts": arch.n_experts,
            "num_experts_per_tok": arch.n_active_experts,
        }
    if family in ("qwen2_moe", "qwen3_moe"):
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
            raise UnsupportedJob(f"model {arch.name!r}: Qwen3-MoE has no shared experts")
        return family, kw
    # Any other RoPE decoder with our structure is a Llama of the same shape.
    if arch.gated_mlp and arch.norm == "rmsnorm" and not arch.is_moe:
        kw = {**common, **attn, "intermediate_size": arch.intermediate_size}
        kw["attention_bias"] = arch.attention_bias
        kw["mlp_bias"] = arch.mlp_bias
        return "llama", kw
    raise UnsupportedJob(
        f"model {arch.name!r}: family {family!r} has no mapping to a Hugging Face class"
    )


def build_model(arch: ModelArch, *, dtype: Any, device: Any) -> Any:
    """Instantiate ``arch`` with random weights directly on ``device`` in ``dtype``.

    Building on the device (not on CPU then ``.to``) keeps host RAM and time flat for 14B
    models. Encoder-only models get their masked-LM head.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    model_type, kwargs = hf_config_kwargs(arch)
    config = AutoConfig.for_model(model_type, **kwargs)
    auto = AutoModelForMaskedLM if model_type == "bert" else AutoModelForCausalLM
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype, attn_implementation=attn_implementation(arch))
    return model


def attn_implementation(arch: ModelArch) -> str:
    """The attention backend a default HF run picks: SDPA (flash / memory-efficient kernels),
    except Gemma-2, whose logit soft-capping HF only implements eagerly."""
    model_type, _ = hf_config_kwargs(arch)
    return "eager" if model_type == "gemma2" else "sdpa"
