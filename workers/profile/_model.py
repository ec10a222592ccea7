"""Map a snugfit :class:`ModelArch` onto a Hugging Face config, and build it with random weights.

Nothing is downloaded: the config is made from our numbers and the model from ``from_config``.
Families the harness cannot reproduce faithfully raise :class:`UnsupportedJob` so the sweep
records a skip row instead of measuring a different model under the same name.
"""

from __future__ import annotations

import os
from typing import Any

from predictor import arch_to_hf
from predictor.exceptions import UnmappedArchError
from predictor.models import ModelArch

__all__ = ["UnsupportedJob", "attn_implementation", "build_model", "hf_config_kwargs"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class UnsupportedJob(Exception):
    """The harness cannot run this job faithfully; ``str(exc)`` says why and what would fix it."""


def hf_config_kwargs(arch: ModelArch) -> tuple[str, dict[str, Any]]:
    """``(model_type, config kwargs)`` reproducing ``arch``: the traced tier's mapping
    (:mod:`predictor.arch_to_hf`), so the profiler measures what the tracer traces."""
    try:
        return arch_to_hf.hf_config_kwargs(arch)
    except UnmappedArchError as exc:
        raise UnsupportedJob(str(exc)) from exc


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
