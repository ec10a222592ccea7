"""Field rules for the published tables: free-text GPU, dtype, framework, optimizer, LoRA, stat.

Shared by the VRAM and runtime converters of :mod:`predictor._published`.
"""

from __future__ import annotations

import re
from typing import Any

__all__: list[str] = []


class _Skip(Exception):
    """Raised inside a converter: the row cannot be expressed, for the given reason."""


# ------------------------------------------------------------------------------ GPUs
def _gpu(raw: str | None) -> tuple[str | None, float | None]:
    """(catalogue name or None, memory GiB or None) from a free-text GPU description."""
    if not raw:
        return None, None
    s = raw.upper()
    mem_match = re.search(r"(\d{2,3})\s*GB", s)
    mem = float(mem_match.group(1)) if mem_match else None
    if "A100" in s:
        if "40GB" in s.replace(" ", "") or "(40GB)" in s:
            return "A100-40GB", 40.0
        if "80GB" in s.replace(" ", ""):
            return "A100-80GB", 80.0
        return None, mem
    if "H100" in s and "PCIE" not in s and "NVL" not in s:
        return "H100-80GB", 80.0
    if "H200" in s:
        return "H200-141GB", 141.0
    if "B200" in s:
        return "B200-180GB", 180.0
    return None, mem


# ------------------------------------------------------------------------------ fields
def _dtype(raw: str | None) -> str | None:
    if not raw:
        return None
    s = raw.lower()
    for key, val in (
        ("nvfp4", "fp4"),
        ("mxfp4", "fp4"),
        ("fp4", "fp4"),
        ("nf4", "nf4"),
        ("mxfp8", "fp8"),
        ("fp8", "fp8"),
        ("int8", "int8"),
        ("int4", "int4"),
        ("bf16", "bf16"),
        ("fp16", "fp16"),
        ("fp32", "fp32"),
    ):
        if key in s:
            return val
    return None


def _framework(raw: str | None) -> str:
    s = (raw or "").lower()
    for key, val in (
        ("tensorrt", "trtllm"),
        # NeMo AutoModel is NVIDIA's PyTorch-native stack (HF models under FSDP2), not
        # Megatron-Core: its performance summary says "PyTorch backend, FSDP2".
        ("automodel", "fsdp"),
        ("nim", "trtllm"),
        ("vllm", "vllm"),
        ("sglang", "sglang"),
        ("torchtune", "torchtune"),
        ("deepspeed", "deepspeed"),
        ("megatron", "megatron"),
        ("nemo", "megatron"),
        ("llama-recipes", "fsdp"),
        ("llm-foundry", "fsdp"),
        ("torchtitan", "fsdp"),
        ("unsloth", "hf"),
        ("peft", "peft"),
        ("transformers", "hf"),
    ):
        if key in s:
            return val
    return "other"


def _optimizer(raw: str | None) -> str:
    s = (raw or "").lower().replace(" ", "")
    if "paged" in s and "8bit" in s:
        return "paged_adamw_8bit"
    if "8bit" in s:
        return "adamw_8bit"
    if "adafactor" in s:
        return "adafactor"
    if "sgd" in s:
        return "sgd"
    # 32-bit paged AdamW keeps fp32 states on the GPU until memory runs short.
    return "adamw"


def _lora(raw: str | None) -> tuple[int | None, str]:
    s = (raw or "").lower()
    m = re.search(r"\br\s*=\s*(\d+)", s)
    rank = int(m.group(1)) if m else None
    if "all-linear" in s or "mlp" in s or "gate" in s or "all (" in s:
        target = "all_linear"
    elif re.search(r"q,\s*k,\s*v", s):
        target = "attention"
    else:
        # "query,value", "q_proj,v_proj", PEFT's default for Llama/T5.
        target = "qv"
    return rank, target


def _zero_stage(text: str) -> int:
    s = text.lower()
    if "full shard" in s or "full_shard" in s or "zero-3" in s or "zero3" in s or "fsdp" in s:
        return 3
    if "zero-2" in s:
        return 2
    if "zero-1" in s:
        return 1
    return 0


def _kind(text: str) -> str:
    s = text.lower()
    # Sources that say which torch stat they print win; "not stated" about *which stat* loses.
    if any(k in s for k in ("alloc/active/reserved not stated", "which of the three", "stat not")):
        return "unknown"
    if "which stat not stated" in s or s.startswith("'peak memory' (torchtune"):
        return "unknown"
    if "nvml" in s or "nvidia-smi" in s or "screenshot" in s or "monitor" in s:
        return "nvml_used"
    if s.startswith("peak active") or "active_bytes" in s:
        return "allocated"
    if "reserved" in s and "allocated" not in s:
        return "reserved"
    if "allocated" in s or "active" in s:
        return "allocated"
    return "unknown"


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float) and v > 0:
        return round(v)
    return None
