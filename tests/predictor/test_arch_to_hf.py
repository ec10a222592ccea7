"""The one ModelArch -> Hugging Face mapping shared by the traced tier and the profiler."""

from __future__ import annotations

import dataclasses

import pytest

from predictor.arch_to_hf import hf_config_kwargs, hf_family
from predictor.exceptions import UnmappedArchError
from predictor.models import catalogue, resolve_model
from tests.jobs import TINY_LLAMA


def test_every_catalogue_model_maps_or_says_why() -> None:
    mapped = 0
    for name, arch in catalogue().items():
        try:
            model_type, kw = hf_config_kwargs(arch)
        except UnmappedArchError as exc:
            assert repr(arch.name) in str(exc), name  # the message names the model
            continue
        mapped += 1
        assert model_type == hf_family(arch)
        layers = kw.get("num_hidden_layers", kw.get("n_layer"))
        assert layers == arch.n_layers
    assert mapped >= 20  # the dense and MoE decoders of the catalogue


def test_mla_is_refused_with_the_reason() -> None:
    with pytest.raises(UnmappedArchError, match="MLA"):
        hf_config_kwargs(resolve_model("deepseek-v3"))


def test_generic_gated_rmsnorm_decoder_is_a_llama() -> None:
    arch = dataclasses.replace(resolve_model("llama-3.1-8b"), family="generic")
    model_type, kw = hf_config_kwargs(arch)
    assert model_type == "llama"
    assert kw["num_key_value_heads"] == arch.n_kv_heads
    assert kw["mlp_bias"] == arch.mlp_bias


def test_traced_and_profiler_build_the_same_config() -> None:
    pytest.importorskip("transformers")
    from predictor.traced._build import hf_config
    from workers.profile._model import hf_config_kwargs as profile_kwargs

    arch = resolve_model("qwen2.5-7b")
    model_type, kw = profile_kwargs(arch)
    traced = hf_config(arch)
    assert traced.model_type == model_type
    assert traced.num_hidden_layers == kw["num_hidden_layers"]
    assert traced.intermediate_size == kw["intermediate_size"]


def test_rotary_layernorm_gelu_decoder_is_gpt_neox_and_gqa_ones_are_refused() -> None:
    from predictor.models import ModelArch

    # The tiny llama's sizes with every head its own KV head, a plain MLP and LayerNorm.
    sizes = {**TINY_LLAMA, "name": "phi-like", "n_layers": 24, "n_kv_heads": 4}
    phi = ModelArch(**sizes, gated_mlp=False, norm="layernorm", position="rope")
    model_type, kw = hf_config_kwargs(phi)
    assert model_type == "gpt_neox"
    assert kw["use_parallel_residual"] and kw["num_hidden_layers"] == 24
    falcon = dataclasses.replace(phi, name="falcon-like", n_kv_heads=1)
    with pytest.raises(UnmappedArchError, match="falcon-like"):
        hf_config_kwargs(falcon)
