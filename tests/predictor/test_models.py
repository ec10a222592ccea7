"""Model catalogue and architecture arithmetic (predictor/models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from predictor.exceptions import SpecError, UnknownModelError
from predictor.models import (
    EXPLICIT_KEYS,
    ModelArch,
    catalogue,
    catalogue_aliases,
    from_hf_config,
    resolve_model,
)

FIXTURES = Path(__file__).parent / "fixtures"
CATALOGUE = catalogue()

# Published active parameter counts (billions) and the convention each source uses.
PUBLISHED_ACTIVE_B = {
    # name: (published active, include_input_embedding)
    "mixtral-8x7b": (12.9, True),
    "qwen3-30b-a3b": (3.3, True),
    "gpt-oss-20b": (3.61, False),
    "gpt-oss-120b": (5.13, False),
    "deepseek-v3": (37.0, True),
}

# Exact counts reported by transformers' ``model.num_parameters()`` for these checkpoints.
EXACT_HF_COUNTS = {
    "gpt2": 124_439_808,
    "bert-base-uncased": 109_482_240,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "llama-3-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "gemma-2-2b": 2_614_341_888,
}

REQUIRED_MODELS = [
    "gpt2",
    "gpt2-xl",
    "bert-base-uncased",
    "bert-large",
    "mpt-7b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.3-70b",
    "mistral-7b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "gemma-2-2b",
    "gemma-2-9b",
    "gemma-2-27b",
    "phi-3-mini",
    "phi-3-medium",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "deepseek-v3",
]


# ------------------------------------------------------------------ catalogue
def test_catalogue_has_required_models() -> None:
    assert len(CATALOGUE) >= 28
    missing = [m for m in REQUIRED_MODELS if m not in CATALOGUE]
    assert not missing


def test_catalogue_rows_have_sources_and_only_known_keys() -> None:
    from predictor._paths import datasets_dir

    rows = json.loads((datasets_dir() / "models" / "catalogue.json").read_text())
    fields = set(ModelArch.__dataclass_fields__)
    for row in rows:
        assert set(row) == fields | {"aliases", "params_source"}, row["name"]
        assert row["source"].startswith("https://"), row["name"]
        assert row["params_source"], row["name"]
        assert row["params_b"] is not None and row["params_b"] > 0, row["name"]
        assert row["name"] == row["name"].lower()
        assert isinstance(row["aliases"], list)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_total_params_match_published(name: str) -> None:
    arch = CATALOGUE[name]
    assert arch.params_b is not None
    computed_b = arch.total_params() / 1e9
    assert abs(computed_b - arch.params_b) / arch.params_b <= 0.02, (computed_b, arch.params_b)


@pytest.mark.parametrize("name", sorted(EXACT_HF_COUNTS))
def test_total_params_exact_for_known_checkpoints(name: str) -> None:
    assert CATALOGUE[name].total_params() == EXACT_HF_COUNTS[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_B))
def test_moe_active_params_match_published(name: str) -> None:
    arch = CATALOGUE[name]
    published, with_embedding = PUBLISHED_ACTIVE_B[name]
    active_b = arch.active_params(include_input_embedding=with_embedding) / 1e9
    assert abs(active_b - published) / published <= 0.03, (active_b, published)
    assert arch.active_params() < arch.total_params()
    assert arch.is_moe


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_dense_active_equals_total_and_parts_add_up(name: str) -> None:
    arch = CATALOGUE[name]
    if not arch.is_moe:
        assert arch.active_params() == arch.total_params()
    assert 0 < arch.embedding_params() < arch.total_params()
    assert arch.non_embedding_params() == arch.total_params() - arch.embedding_params()
    assert arch.n_params_b == pytest.approx(arch.total_params() / 1e9)


def test_deepseek_v3_excludes_mtp_module() -> None:
    arch = CATALOGUE["deepseek-v3"]
    # 671B main model; the Hub checkpoint's 685B adds the 14B MTP module.
    assert 665e9 < arch.total_params() < 677e9
    assert arch.uses_mla and arch.n_moe_layers == 58 and arch.n_dense_mlp_layers == 3


def test_gemma2_head_dim_differs_from_hidden_over_heads() -> None:
    arch = CATALOGUE["gemma-2-9b"]
    assert arch.head_dim == 256 != arch.hidden_size // arch.n_heads
    assert arch.tie_embeddings and arch.vocab_size == 256000


# ------------------------------------------------------------------ KV cache
def test_kv_elems_llama31_8b() -> None:
    arch = CATALOGUE["llama-3.1-8b"]
    assert arch.kv_elems_per_token_per_layer() == 2 * 8 * 128
    assert arch.kv_elems_per_token() == 32 * 2 * 8 * 128


def test_kv_elems_mla_is_compressed() -> None:
    assert CATALOGUE["deepseek-v3"].kv_elems_per_token_per_layer() == 512 + 64


def test_kv_elems_encoder_only_is_zero() -> None:
    assert CATALOGUE["bert-base-uncased"].kv_elems_per_token_per_layer() == 0


# ------------------------------------------------------------------ linear layers / LoRA
def test_lora_qv_llama2_7b_matches_peft() -> None:
    # PEFT's print_trainable_parameters for Llama-2-7b, r=8, target q_proj+v_proj.
    assert CATALOGUE["llama-2-7b"].lora_params(8, "qv") == 4_194_304


def test_lora_all_linear_llama2_7b_matches_peft() -> None:
    # r=16 on q,k,v,o,gate,up,down: 39,976,960 trainable (widely quoted PEFT figure).
    assert CATALOGUE["llama-2-7b"].lora_params(16, "all_linear") == 39_976_960


def test_lora_targets_nest_and_scale_with_rank() -> None:
    for arch in CATALOGUE.values():
        qv = arch.lora_params(8, "qv")
        attn = arch.lora_params(8, "attention")
        every = arch.lora_params(8, "all_linear")
        assert 0 < qv < attn <= every, arch.name
        assert arch.lora_params(16, "attention") == 2 * attn


def test_lora_unknown_target_names_allowed_values() -> None:
    with pytest.raises(SpecError, match="all_linear, attention, qv"):
        CATALOGUE["llama-3-8b"].lora_params(8, "mlp")
    with pytest.raises(SpecError):
        CATALOGUE["llama-3-8b"].lora_params(0, "qv")


def test_linear_layers_shapes() -> None:
    layers = {n: (i, o, c) for n, i, o, c in CATALOGUE["llama-3.1-8b"].linear_layers()}
    assert layers["q_proj"] == (4096, 4096, 32)
    assert layers["k_proj"] == (4096, 1024, 32)
    assert layers["down_proj"] == (14336, 4096, 32)
    assert layers["lm_head"] == (4096, 128256, 1)
    moe = {n: (i, o, c) for n, i, o, c in CATALOGUE["mixtral-8x7b"].linear_layers()}
    assert moe["expert_gate_proj"] == (4096, 14336, 32 * 8)
    assert "gate_proj" not in moe
    active = {n: c for n, _, _, c in CATALOGUE["mixtral-8x7b"].linear_layers(active_only=True)}
    assert active["expert_gate_proj"] == 32 * 2
    ds = {n: c for n, _, _, c in CATALOGUE["deepseek-v3"].linear_layers()}
    assert ds["shared_up_proj"] == 58 and ds["gate_proj"] == 3 and ds["kv_b_proj"] == 61
    gpt2 = {n for n, *_ in CATALOGUE["gpt2"].linear_layers()}
    assert "gate_proj" not in gpt2


def test_linear_weights_bound_total_params() -> None:
    for arch in CATALOGUE.values():
        weights = sum(i * o * c for n, i, o, c in arch.linear_layers() if n != "lm_head")
        assert weights < arch.total_params(), arch.name


# ------------------------------------------------------------------ resolve by name
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("LLaMA-3.1-8B", "llama-3.1-8b"),
        ("  llama-3.1-8b ", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
    ],
)
def test_resolve_by_name_and_alias(value: str, expected: str) -> None:
    assert resolve_model(value).name == expected


def test_aliases_are_unique_and_point_to_catalogue() -> None:
    aliases = catalogue_aliases()
    assert aliases
    assert set(aliases.values()) <= set(CATALOGUE)


def test_resolve_passes_modelarch_through() -> None:
    arch = CATALOGUE["gpt2"]
    assert resolve_model(arch) is arch


def test_typo_suggests_closest_name() -> None:
    with pytest.raises(UnknownModelError) as err:
        resolve_model("lama-3-8b")
    msg = str(err.value)
    assert "unknown model 'lama-3-8b'" in msg
    assert "did you mean 'llama-3-8b'" in msg
    assert "config.json" in msg and "explicit architecture numbers" in msg


def test_unknown_model_without_suggestion() -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'zzzz'"):
        resolve_model("zzzz")


def test_missing_config_path_is_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match=r"no such config\.json"):
        resolve_model(str(tmp_path / "nope" / "config.json"))


# ------------------------------------------------------------------ explicit object
def test_explicit_object_defaults() -> None:
    arch = resolve_model(
        {
            "name": "my-llama",
            "n_layers": 32,
            "hidden_size": 4096,
            "n_heads": 32,
            "intermediate_size": 11008,
            "vocab_size": 32000,
            "params_b": 6.74,
        }
    )
    assert arch.n_kv_heads == 32 and arch.head_dim == 128
    assert arch.total_params() == CATALOGUE["llama-2-7b"].total_params()


def test_explicit_object_all_contract_keys_moe() -> None:
    spec = {
        "name": "mini-moe",
        "n_layers": 4,
        "hidden_size": 256,
        "n_heads": 8,
        "n_kv_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "tie_embeddings": True,
        "n_experts": 4,
        "n_active_experts": 2,
        "params_b": 0.003,
    }
    assert set(spec) == set(EXPLICIT_KEYS)
    arch = resolve_model(spec)
    assert arch.is_moe
    attn = 256 * 512 + 2 * 256 * 128 + 512 * 256
    expert = 3 * 256 * 512
    router = 256 * 4
    norms = 2 * 256
    per_layer = attn + 4 * expert + router + norms
    assert arch.total_params() == 4 * per_layer + 1000 * 256 + 256
    assert arch.total_params() - arch.active_params() == 4 * 2 * expert


def test_explicit_object_unknown_key() -> None:
    with pytest.raises(SpecError, match=r"unknown model key 'layers'.*allowed keys: name"):
        resolve_model({"layers": 3, "hidden_size": 64})


@pytest.mark.parametrize("bad", [0, -4, 2.5, "big", True])
def test_explicit_object_rejects_bad_sizes(bad: object) -> None:
    spec = {"n_layers": 2, "hidden_size": 64, "n_heads": 4, "intermediate_size": 128}
    spec["vocab_size"] = bad  # type: ignore[assignment]
    with pytest.raises(SpecError, match="vocab_size"):
        resolve_model(spec)


def test_explicit_object_missing_required() -> None:
    with pytest.raises(SpecError, match="missing vocab_size"):
        resolve_model({"n_layers": 2, "hidden_size": 64, "n_heads": 4, "intermediate_size": 128})


def test_explicit_object_inconsistent_heads() -> None:
    with pytest.raises(SpecError, match="n_kv_heads"):
        resolve_model(
            {
                "n_layers": 2,
                "hidden_size": 64,
                "n_heads": 4,
                "n_kv_heads": 3,
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        )


@given(
    n_layers=st.integers(1, 64),
    heads=st.sampled_from([1, 2, 4, 8, 16]),
    head_dim=st.sampled_from([16, 32, 64, 128]),
    groups=st.sampled_from([1, 2, 4]),
    inter=st.integers(1, 20000),
    vocab=st.integers(1, 200000),
    tie=st.booleans(),
)
def test_explicit_params_formula(
    n_layers: int, heads: int, head_dim: int, groups: int, inter: int, vocab: int, tie: bool
) -> None:
    hidden = heads * head_dim
    kv = max(1, heads // groups)
    arch = resolve_model(
        {
            "n_layers": n_layers,
            "hidden_size": hidden,
            "n_heads": heads,
            "n_kv_heads": kv,
            "intermediate_size": inter,
            "vocab_size": vocab,
            "tie_embeddings": tie,
        }
    )
    per_layer = 2 * hidden * hidden + 2 * hidden * kv * head_dim + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden * (1 if tie else 2)
    assert arch.total_params() == n_layers * per_layer + embed + hidden
    assert arch.kv_elems_per_token_per_layer() == 2 * kv * head_dim


# ------------------------------------------------------------------ Hugging Face config.json
@pytest.mark.parametrize(
    "name", sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
)
def test_hf_config_matches_catalogue(name: str) -> None:
    from_path = resolve_model(str(FIXTURES / name / "config.json"))
    from_dir = resolve_model(str(FIXTURES / name))
    ref = CATALOGUE[name]
    assert from_path.total_params() == ref.total_params()
    assert from_path.active_params() == ref.active_params()
    assert from_path.kv_elems_per_token_per_layer() == ref.kv_elems_per_token_per_layer()
    assert from_path.lora_params(8, "all_linear") == ref.lora_params(8, "all_linear")
    assert from_dir == from_path


def test_hf_config_llama31_8b_fields() -> None:
    arch = resolve_model(FIXTURES / "llama-3.1-8b" / "config.json")
    assert (arch.n_layers, arch.n_kv_heads, arch.head_dim) == (32, 8, 128)
    assert arch.max_position_embeddings == 131072 and not arch.tie_embeddings


def test_hf_config_deepseek_v3_mla() -> None:
    arch = resolve_model(str(FIXTURES / "deepseek-v3"))
    assert arch.uses_mla and arch.n_dense_layers == 3 and arch.n_shared_experts == 1
    assert arch.kv_elems_per_token_per_layer() == 576


def test_hf_config_generic_fallback() -> None:
    arch = from_hf_config(
        {
            "model_type": "some_new_llm",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        },
        name="tiny",
    )
    assert arch.name == "tiny" and arch.n_kv_heads == 4 and arch.head_dim == 16
    assert arch.family == "some_new_llm"


def test_hf_config_missing_key_named() -> None:
    with pytest.raises(SpecError, match="'hidden_size'"):
        from_hf_config({"model_type": "llama", "num_hidden_layers": 2})


def test_hf_config_qwen2_moe_shared_expert() -> None:
    arch = from_hf_config(
        {
            "model_type": "qwen2_moe",
            "num_hidden_layers": 24,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "intermediate_size": 5632,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        }
    )
    assert arch.n_shared_experts == 4 and arch.moe_intermediate_size == 1408
    # Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated.
    assert abs(arch.total_params() / 1e9 - 14.3) / 14.3 < 0.02
    assert abs(arch.active_params() / 1e9 - 2.7) / 2.7 < 0.03


def test_hf_config_mpt() -> None:
    arch = from_hf_config(
        {
            "model_type": "mpt",
            "d_model": 4096,
            "n_heads": 32,
            "n_layers": 32,
            "expansion_ratio": 4,
            "max_seq_len": 2048,
            "vocab_size": 50432,
            "no_bias": True,
            "attn_config": {"alibi": True},
        }
    )
    assert arch.position == "alibi" and not arch.gated_mlp
    assert abs(arch.total_params() - CATALOGUE["mpt-7b"].total_params()) < 1e6


def test_bad_json_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="cannot read"):
        resolve_model(str(bad))
