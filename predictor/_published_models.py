"""Model names in the published tables mapped onto catalogue names or explicit architectures."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._published_fields import _Skip
from .exceptions import SpecError
from .models import catalogue, resolve_model

__all__: list[str] = []


# Names in the tables that are the same architecture as a catalogue entry under another name.
_SAME_ARCH: dict[str, tuple[str, str]] = {
    "qwq-32b": ("qwen2.5-32b", "QwQ-32B is a Qwen2.5-32B fine-tune (same config.json shape)"),
    "deepseek-r1-0528": ("deepseek-v3", "DeepSeek-R1 shares the DeepSeek-V3 architecture"),
    "deepseekv3": ("deepseek-v3", "DeepSeek-V3 under the NeMo recipe name"),
    "deepseek-v3-671b": ("deepseek-v3", "DeepSeek-V3"),
    "deepseek-v3/r1": ("deepseek-v3", "DeepSeek-V3/R1 share one architecture"),
    "llama-7b": ("llama-2-7b", "row says LLaMA 7B; Llama-2-7B has the same shape"),
    "llama-70b": ("llama-2-70b", "row says LLaMA 70B (Llama-2 per the source's methodology)"),
}

# Families whose MLP is a plain 2-matrix GELU MLP with LayerNorm (not SwiGLU/RMSNorm).
_PLAIN_MLP_FAMILIES = ("falcon", "phi-1", "phi-2", "stablelm", "gpt-j", "gpt-neox", "mpt", "bloom")

# Architectures the catalogue lacks and the rows give only partly; numbers from each model's
# Hugging Face config.json (cited per entry).
_EXTRA_ARCHS: dict[str, dict[str, Any]] = {
    "gpt-j-6b": {
        "name": "gpt-j-6b",
        "n_layers": 28,
        "hidden_size": 4096,
        "n_heads": 16,
        "n_kv_heads": 16,
        "head_dim": 256,
        "intermediate_size": 16384,
        "vocab_size": 50400,
        "params_b": 6.05,
        "gated_mlp": False,
        "norm": "layernorm",
        "attention_bias": False,
        "mlp_bias": True,
        "source": "https://huggingface.co/EleutherAI/gpt-j-6b/blob/main/config.json",
    },
    "falcon-180b": {
        "name": "falcon-180b",
        "n_layers": 80,
        "hidden_size": 14848,
        "n_heads": 232,
        "n_kv_heads": 8,
        "head_dim": 64,
        "intermediate_size": 59392,
        "vocab_size": 65024,
        "params_b": 180.0,
        "gated_mlp": False,
        "norm": "layernorm",
        "source": "https://huggingface.co/tiiuae/falcon-180B/blob/main/config.json",
    },
    "bloom-176b": {
        "name": "bloom-176b",
        "n_layers": 70,
        "hidden_size": 14336,
        "n_heads": 112,
        "n_kv_heads": 112,
        "head_dim": 128,
        "intermediate_size": 57344,
        "vocab_size": 250880,
        "tie_embeddings": True,
        "params_b": 176.0,
        "gated_mlp": False,
        "norm": "layernorm",
        "position": "alibi",
        "attention_bias": True,
        "mlp_bias": True,
        "source": "https://huggingface.co/bigscience/bloom/blob/main/config.json",
    },
}

# MPT yamls in llm-foundry pad the GPT-NeoX tokenizer to 50368.
_MPT_VOCAB = 50368


def _norm_name(raw: str) -> str:
    s = re.sub(r"\(.*?\)", "", raw).strip().lower()
    s = s.replace("_", "-").replace(" ", "-")
    s = re.sub(r"-+", "-", s).strip("-")
    s = re.sub(r"^llama(\d)", r"llama-\1", s)
    s = re.sub(r"-(instruct|chat|hf|it|v0\.1|2-node)$", "", s)
    return s


def _resolve_model(raw: str, arch: Mapping[str, Any] | None, params_b: float | None) -> Any:
    """The JobSpec ``model`` value for a table row: a catalogue name or an explicit object."""
    name = _norm_name(raw)
    cat = catalogue()
    truncated = re.search(r"truncated to (\d+) layers", raw)
    if truncated:
        base = "llama-3.1-405b" if "405b" in name else None
        if base is None:
            raise _Skip(f"truncated proxy model {raw!r} with no full base architecture")
        d = {k: v for k, v in cat[base].to_dict().items() if v is not None}
        d["n_layers"] = int(truncated.group(1))
        d["name"] = f"{base}-{d['n_layers']}l"
        d["params_b"] = None
        return {k: v for k, v in d.items() if v is not None}
    for key in (name, re.sub(r"-tokendrop|-dropless|-w/-mtp", "", name)):
        if key in _SAME_ARCH:
            return _SAME_ARCH[key][0]
        if key in _EXTRA_ARCHS:
            return dict(_EXTRA_ARCHS[key])
        try:
            found = resolve_model(key)
        except SpecError:
            continue
        return found.name
    if arch and name.startswith("mpt-") and arch.get("d_model"):
        d_model = int(arch["d_model"])
        return {
            "name": name,
            "n_layers": int(arch["n_layers"]),
            "hidden_size": d_model,
            "n_heads": int(arch["n_heads"]),
            "intermediate_size": int(arch.get("expansion_ratio", 4)) * d_model,
            "vocab_size": int(arch.get("vocab") or _MPT_VOCAB),
            "tie_embeddings": True,
            "gated_mlp": False,
            "norm": "layernorm",
            "position": "alibi",
            "params_b": params_b,
        }
    if arch:
        # vram_measured rows carry litgpt-style arch numbers.
        layers, hidden = arch.get("layers"), arch.get("hidden")
        if isinstance(layers, int) and isinstance(hidden, int) and arch.get("vocab"):
            plain = any(name.startswith(f) for f in _PLAIN_MLP_FAMILIES)
            obj: dict[str, Any] = {
                "name": name,
                "n_layers": layers,
                "hidden_size": hidden,
                "n_heads": int(arch["heads"]),
                "n_kv_heads": int(arch.get("kv_heads") or arch["heads"]),
                "intermediate_size": int(arch["intermediate"]),
                "vocab_size": int(arch["vocab"]),
                "gated_mlp": not plain,
                "params_b": params_b,
            }
            if plain:
                obj["norm"] = "layernorm"
            return {k: v for k, v in obj.items() if v is not None}
    raise _Skip(f"model {raw!r} is not in the catalogue and the row gives no full architecture")
