"""Hugging Face ``config.json`` files read offline into a :class:`ModelArch`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from predictor._model_arch import ModelArch
from predictor._model_explicit import _as_int
from predictor.exceptions import SpecError, UnknownModelError

__all__ = ["from_hf_config", "load_hf_config"]


def _hf_cache_config(repo_id: str) -> Path | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache, if one is there."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        return None
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    roots.append(Path(hf_home) / "hub")
    folder = "models--" + repo_id.replace("/", "--")
    for root in roots:
        snapshots = root / folder / "snapshots"
        if snapshots.is_dir():
            for snap in sorted(snapshots.iterdir()):
                cfg = snap / "config.json"
                if cfg.is_file():
                    return cfg
    return None


def load_hf_config(path: str | os.PathLike[str]) -> ModelArch:
    """Read a Hugging Face ``config.json`` (or a directory holding one) offline."""
    from .limits import MAX_CONFIG_BYTES

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise SpecError(
                f"{str(p)!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB, so it is not a Hugging "
                "Face config.json; point `model` at the model's config.json"
            )
        config = json.loads(data.decode("utf-8", "replace"))
    except FileNotFoundError as exc:
        raise UnknownModelError(f"no Hugging Face config.json at {str(p)!r}") from exc
    except RecursionError:
        raise SpecError(f"Hugging Face config {str(p)!r} is nested too deeply") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read Hugging Face config {str(p)!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise SpecError(f"{str(p)!r} is not a JSON object")
    name = config.get("_name_or_path") or p.parent.name or "custom"
    arch = from_hf_config(config, name=str(name))
    return dataclasses.replace(arch, source=str(p.resolve()))


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _need(config: Mapping[str, Any], model_type: str, *keys: str) -> Any:
    value = _first(config, *keys)
    if value is None:
        raise SpecError(
            f"Hugging Face config (model_type {model_type!r}) has no {keys[0]!r}"
            + (f" (nor {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else "")
            + "; pass explicit architecture numbers instead"
        )
    return value


# model_type → (tie default, norm, position, gated, attention_bias default, mlp_bias default)
_HF_DEFAULTS: dict[str, tuple[bool, str, str, bool, bool, bool]] = {
    "llama": (False, "rmsnorm", "rope", True, False, False),
    "mistral": (False, "rmsnorm", "rope", True, False, False),
    "qwen2": (False, "rmsnorm", "rope", True, True, False),
    "qwen3": (False, "rmsnorm", "rope", True, False, False),
    "qwen2_moe": (False, "rmsnorm", "rope", True, True, False),
    "qwen3_moe": (False, "rmsnorm", "rope", True, False, False),
    "mixtral": (False, "rmsnorm", "rope", True, False, False),
    "gemma": (True, "rmsnorm", "rope", True, False, False),
    "gemma2": (True, "rmsnorm", "rope", True, False, False),
    "phi3": (False, "rmsnorm", "rope", True, False, False),
    "gpt2": (True, "layernorm", "learned", False, True, True),
    "bert": (True, "layernorm", "learned", False, True, True),
    "mpt": (True, "layernorm", "alibi", False, False, False),
    "deepseek_v3": (False, "rmsnorm", "rope", True, False, False),
    "deepseek_v2": (False, "rmsnorm", "rope", True, False, False),
    "gpt_oss": (False, "rmsnorm", "rope", True, True, True),
}


def from_hf_config(config: Mapping[str, Any], name: str | None = None) -> ModelArch:
    """Map a Hugging Face ``config.json`` (already parsed) onto a :class:`ModelArch`.

    Known ``model_type`` values: llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral,
    gemma, gemma2, phi3, gpt2, bert, mpt, deepseek_v2, deepseek_v3, gpt_oss; anything else is read
    through the common keys (a llama-like decoder is assumed). A missing key raises SpecError.
    """
    if not isinstance(config, Mapping):
        raise SpecError(f"Hugging Face config must be an object, got {type(config).__name__}")
    cfg: dict[str, Any] = dict(config)
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}  # multimodal wrappers keep the LM in text_config
    model_type = str(cfg.get("model_type") or "")
    tie_default, norm, position, gated, attn_bias, mlp_bias = _HF_DEFAULTS.get(
        model_type, (False, "rmsnorm", "rope", True, False, False)
    )
    arch_name = name or str(cfg.get("_name_or_path") or model_type or "custom")

    if model_type == "mpt":
        return _mpt_arch(cfg, arch_name)

    n_layers = _as_int(
        "num_hidden_layers", _need(cfg, model_type, "num_hidden_layers", "n_layer", "num_layers")
    )
    hidden = _as_int("hidden_size", _need(cfg, model_type, "hidden_size", "n_embd", "d_model"))
    n_heads = _as_int(
        "num_attention_heads", _need(cfg, model_type, "num_attention_heads", "n_head")
    )
    n_kv = _as_int(
        "num_key_value_heads",
        _first(cfg, "num_key_value_heads", "multi_query_group_num") or n_heads,
    )
    head_dim_raw = cfg.get("head_dim")
    head_dim = _as_int("head_dim", head_dim_raw) if head_dim_raw else hidden // n_heads
    if model_type == "gpt2":
        intermediate = _as_int("n_inner", cfg.get("n_inner") or 4 * hidden)
    else:
        intermediate = _as_int(
            "intermediate_size",
            _need(cfg, model_type, "intermediate_size", "ffn_dim", "n_inner"),
        )
    vocab = _as_int("vocab_size", _need(cfg, model_type, "vocab_size"))
    tie = cfg.get("tie_word_embeddings")
    tie = tie_default if tie is None else bool(tie)
    max_pos = _as_int(
        "max_position_embeddings",
        _first(cfg, "max_position_embeddings", "n_positions", "max_seq_len") or 4096,
    )
    attention_bias = cfg.get("attention_bias")
    attention_bias = attn_bias if attention_bias is None else bool(attention_bias)
    if model_type in ("qwen2", "qwen2_moe"):
        attention_bias = True  # q/k/v biases are hard-wired in Qwen2 attention
    mlp_b = cfg.get("mlp_bias")
    mlp_b = mlp_bias if mlp_b is None else bool(mlp_b)

    n_experts, n_active, moe_width, n_shared, n_dense = _moe_fields(cfg, model_type, intermediate)
    mla = _mla_fields(cfg, model_type)
    if mla:
        head_dim = mla["qk_rope_head_dim"] + mla["qk_nope_head_dim"]
        n_kv = n_heads

    encoder_only = model_type in ("bert", "roberta")
    if encoder_only:
        tie = True
    family = model_type or "generic"
    return ModelArch(
        name=arch_name,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_embeddings=tie,
        n_experts=n_experts,
        n_active_experts=n_active,
        gated_mlp=gated,
        moe_intermediate_size=moe_width,
        n_shared_experts=n_shared,
        n_dense_layers=n_dense,
        attention_bias=attention_bias,
        mlp_bias=mlp_b,
        norm=norm,
        position=position,
        max_position_embeddings=max_pos,
        encoder_only=encoder_only,
        family=family,
        **mla,
    )


def _mpt_arch(cfg: Mapping[str, Any], arch_name: str) -> ModelArch:
    """MPT keeps its own key names (``d_model``, ``attn_config``, ``expansion_ratio``)."""
    attn_cfg = cfg.get("attn_config") or {}
    hidden = _as_int("d_model", _need(cfg, "mpt", "d_model"))
    n_heads = _as_int("n_heads", _need(cfg, "mpt", "n_heads"))
    n_kv = _as_int("kv_n_heads", attn_cfg.get("kv_n_heads") or n_heads)
    ratio = _need(cfg, "mpt", "expansion_ratio")
    ffn = cfg.get("ffn_config") or {}
    no_bias = bool(cfg.get("no_bias", True))
    return ModelArch(
        name=arch_name,
        n_layers=_as_int("n_layers", _need(cfg, "mpt", "n_layers")),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=hidden // n_heads,
        intermediate_size=_as_int(
            "ffn_hidden_size", ffn.get("ffn_hidden_size") or int(ratio * hidden)
        ),
        vocab_size=_as_int("vocab_size", _need(cfg, "mpt", "vocab_size")),
        tie_embeddings=not bool(cfg.get("no_tie", False)),
        gated_mlp=False,
        attention_bias=not no_bias,
        mlp_bias=not no_bias,
        norm="layernorm",
        position="alibi" if attn_cfg.get("alibi", True) else "learned",
        max_position_embeddings=_as_int("max_seq_len", cfg.get("max_seq_len") or 2048),
        family="mpt",
    )


def _moe_fields(
    cfg: Mapping[str, Any], model_type: str, intermediate: int
) -> tuple[int, int, int | None, int, int]:
    """(routed experts, active per token, expert width or None, shared experts, dense layers)."""
    n_experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts") or 1
    n_experts = _as_int("num_experts", n_experts)
    n_active = 1
    moe_width: int | None = None
    n_shared = 0
    n_dense = 0
    if n_experts > 1:
        n_active = _as_int(
            "num_experts_per_tok",
            _need(cfg, model_type, "num_experts_per_tok", "experts_per_token", "top_k"),
        )
        width = cfg.get("moe_intermediate_size")
        moe_width = _as_int("moe_intermediate_size", width) if width else None
        if moe_width == intermediate:
            moe_width = None
        n_shared = _as_int("n_shared_experts", cfg.get("n_shared_experts") or 0, minimum=0)
        shared_width = cfg.get("shared_expert_intermediate_size")
        if shared_width and not n_shared:
            base = moe_width or intermediate
            n_shared = max(1, round(int(shared_width) / base))  # Qwen2-MoE: one wide expert
        n_dense = _as_int("first_k_dense_replace", cfg.get("first_k_dense_replace") or 0, minimum=0)
        mlp_only = cfg.get("mlp_only_layers") or []
        if not n_dense and mlp_only:
            n_dense = len(mlp_only)
    return n_experts, n_active, moe_width, n_shared, n_dense


def _mla_fields(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The MLA ranks of DeepSeek-V2/V3 (empty for ordinary attention)."""
    kv_lora = cfg.get("kv_lora_rank")
    mla: dict[str, Any] = {}
    if kv_lora:
        mla = {
            "kv_lora_rank": _as_int("kv_lora_rank", kv_lora),
            "q_lora_rank": _as_int("q_lora_rank", cfg["q_lora_rank"])
            if cfg.get("q_lora_rank")
            else None,
            "qk_rope_head_dim": _as_int(
                "qk_rope_head_dim", _need(cfg, model_type, "qk_rope_head_dim")
            ),
            "qk_nope_head_dim": _as_int(
                "qk_nope_head_dim", _need(cfg, model_type, "qk_nope_head_dim")
            ),
            "v_head_dim": _as_int("v_head_dim", _need(cfg, model_type, "v_head_dim")),
        }
    return mla
