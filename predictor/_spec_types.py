"""The enumerations a JobSpec is written in: task, framework, dtype, optimizer, LoRA target."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AttnImplementation", "DType", "Framework", "Head", "LoraTarget", "Optimizer", "Task"]


class Task(StrEnum):
    INFERENCE = "inference"
    FULL_FINETUNE = "full_finetune"
    LORA = "lora"
    QLORA = "qlora"
    PRETRAIN = "pretrain"
    SERVE = "serve"  # a long-running deployment planned by SLO (predictor.serving)

    @property
    def is_training(self) -> bool:
        return self not in (Task.INFERENCE, Task.SERVE)

    @property
    def is_peft(self) -> bool:
        return self in (Task.LORA, Task.QLORA)


class Framework(StrEnum):
    HF = "hf"
    VLLM = "vllm"
    TRTLLM = "trtllm"
    SGLANG = "sglang"
    TORCHTUNE = "torchtune"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    MEGATRON = "megatron"
    PEFT = "peft"
    UNSLOTH = "unsloth"
    OTHER = "other"

    @property
    def is_serving_engine(self) -> bool:
        """Engines that pre-allocate a KV-cache pool up to ``gpu_memory_utilization``."""
        return self in (Framework.VLLM, Framework.TRTLLM, Framework.SGLANG)


class DType(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NF4 = "nf4"
    FP4 = "fp4"

    @property
    def bits(self) -> float:
        return _DTYPE_BITS[self]


# Storage bits per element, without quantisation scales (the memory model adds those).
_DTYPE_BITS: dict[DType, float] = {
    DType.FP32: 32,
    DType.BF16: 16,
    DType.FP16: 16,
    DType.FP8: 8,
    DType.INT8: 8,
    DType.INT4: 4,
    DType.NF4: 4,
    DType.FP4: 4,
}


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    NONE = "none"


class LoraTarget(StrEnum):
    ALL_LINEAR = "all_linear"
    ATTENTION = "attention"
    QV = "qv"


class AttnImplementation(StrEnum):
    """Hugging Face's ``attn_implementation`` names. For memory only ``eager`` differs: it
    materialises the s×s scores; SDPA and FlashAttention-2 kernels never store them."""

    EAGER = "eager"
    SDPA = "sdpa"
    FLASH_ATTENTION_2 = "flash_attention_2"


class Head(StrEnum):
    """The model's output head in training. ``lm``: vocabulary logits (a causal LM, or a masked
    LM for encoders); ``classification``: a sequence-classification head
    (``AutoModelForSequenceClassification``), whose logits are batch × labels."""

    LM = "lm"
    CLASSIFICATION = "classification"
